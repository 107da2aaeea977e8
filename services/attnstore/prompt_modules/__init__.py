"""Prompt modules (Prompt Cache): the PML schema and prompt language, schema positions, and
module identity in the store. Shared by the scheduler (validation) and the worker (encoding);
free of torch and transformers: the caller passes its tokenizer and chat template as callables.
See docs/prompt-modules.md."""

from attnstore.prompt_modules.errors import (
    ArgumentError,
    ArgumentTooLong,
    DuplicateName,
    IllegalName,
    MalformedPml,
    ParamAtRoot,
    PmlError,
    PmlLimitExceeded,
    SchemaMismatch,
    UnionConflict,
    UnknownModule,
)
from attnstore.prompt_modules.identity import (
    SCHEMA_DIGEST_BYTES,
    module_chunk_keys,
    module_key,
    schema_digest,
)
from attnstore.prompt_modules.layout import (
    LayoutItem,
    ModuleLayout,
    ParamLayout,
    PieceLayout,
    SchemaLayout,
    SlotLayout,
    Tokenize,
    layout_schema,
)
from attnstore.prompt_modules.limits import DEFAULT_LIMITS, PmlLimits
from attnstore.prompt_modules.names import ROOT, ModulePath, format_path, parse_path
from attnstore.prompt_modules.nodes import (
    Import,
    Module,
    ModuleUnion,
    Param,
    Prompt,
    PromptNode,
    PromptRole,
    Role,
    RoleBlock,
    Scaffold,
    Schema,
    SchemaNode,
    Text,
)
from attnstore.prompt_modules.printer import print_prompt, print_schema
from attnstore.prompt_modules.prompt_check import check_prompt
from attnstore.prompt_modules.prompt_layout import (
    ArgumentSegment,
    ModuleSegment,
    PromptLayout,
    Segment,
    TextSegment,
    layout_prompt,
)
from attnstore.prompt_modules.prompt_parser import parse_prompt
from attnstore.prompt_modules.roles import RenderRole, RoleFrame, messages_renderer, plain_roles, role_frames
from attnstore.prompt_modules.scaffolds import choose_scaffold
from attnstore.prompt_modules.schema_parser import parse_schema
from attnstore.prompt_modules.structure import module_paths

__all__ = [
    "DEFAULT_LIMITS",
    "ROOT",
    "SCHEMA_DIGEST_BYTES",
    "ArgumentError",
    "ArgumentSegment",
    "ArgumentTooLong",
    "DuplicateName",
    "IllegalName",
    "Import",
    "LayoutItem",
    "MalformedPml",
    "Module",
    "ModuleLayout",
    "ModulePath",
    "ModuleSegment",
    "ModuleUnion",
    "Param",
    "ParamAtRoot",
    "ParamLayout",
    "PieceLayout",
    "PmlError",
    "PmlLimitExceeded",
    "PmlLimits",
    "Prompt",
    "PromptLayout",
    "PromptNode",
    "PromptRole",
    "RenderRole",
    "Role",
    "RoleBlock",
    "RoleFrame",
    "Scaffold",
    "Schema",
    "SchemaLayout",
    "SchemaMismatch",
    "SchemaNode",
    "Segment",
    "SlotLayout",
    "Text",
    "TextSegment",
    "Tokenize",
    "UnionConflict",
    "UnknownModule",
    "check_prompt",
    "choose_scaffold",
    "format_path",
    "layout_prompt",
    "layout_schema",
    "messages_renderer",
    "module_chunk_keys",
    "module_key",
    "module_paths",
    "parse_path",
    "parse_prompt",
    "parse_schema",
    "plain_roles",
    "print_prompt",
    "print_schema",
    "role_frames",
    "schema_digest",
]
