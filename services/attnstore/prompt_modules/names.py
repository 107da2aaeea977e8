"""PML identifiers and module paths."""

from __future__ import annotations

from attnstore.prompt_modules.errors import IllegalName
from attnstore.prompt_modules.limits import PmlLimits

ModulePath = tuple[str, ...]  # ("trip", "hotel"); () is the schema root
ROOT: ModulePath = ()
PATH_SEPARATOR = "."

ROLES = ("system", "user", "assistant")
# Module names become tags in prompts, so they may not shadow PML's own tags.
RESERVED = frozenset({"schema", "module", "param", "union", "scaffold", "prompt", *ROLES})
_PUNCTUATION = frozenset("_-")


def is_identifier(name: str) -> bool:
    """ASCII letter or `_` first, then letters, digits, `_`, `-`: a valid XML tag and no dot."""
    if not name or not name.isascii() or not (name[0].isalpha() or name[0] == "_"):
        return False
    return all(c.isalnum() or c in _PUNCTUATION for c in name)


def check_name(name: str, line: int, element: str, limits: PmlLimits) -> str:
    if len(name) > limits.name_chars_max:
        raise IllegalName(line, element, f"name is {len(name)} characters, over {limits.name_chars_max}")
    if not is_identifier(name):
        raise IllegalName(
            line, element, f"illegal name {name!r}: use a letter or _ then letters, digits, _ or -"
        )
    if name.lower() in RESERVED:
        raise IllegalName(line, element, f"name {name!r} is reserved (a PML tag)")
    return name


def format_path(path: ModulePath) -> str:
    return PATH_SEPARATOR.join(path) if path else "(root)"


def parse_path(text: str) -> ModulePath:
    return tuple(text.split(PATH_SEPARATOR))
