"""PML schema documents to `Schema`, with every structural rule checked on the way."""

from __future__ import annotations

from attnstore.prompt_modules.errors import DuplicateName, MalformedPml, ParamAtRoot, PmlLimitExceeded
from attnstore.prompt_modules.limits import DEFAULT_LIMITS, PmlLimits
from attnstore.prompt_modules.names import ROLES, check_name
from attnstore.prompt_modules.nodes import (
    Module,
    ModuleUnion,
    Param,
    RoleBlock,
    Schema,
    SchemaNode,
    Text,
)
from attnstore.prompt_modules.scaffolds import check_scaffolds, parse_scaffold
from attnstore.prompt_modules.structure import child_slots, params_of
from attnstore.prompt_modules.xml_tree import XmlElement, XmlText, check_attributes, parse_xml


def parse_schema(document: str, limits: PmlLimits = DEFAULT_LIMITS) -> Schema:
    root = parse_xml(
        document, bytes_max=limits.schema_bytes_max, depth_max=limits.nesting_depth_max, kind="schema"
    )
    return _SchemaParser(limits).schema(root)


class _SchemaParser:
    def __init__(self, limits: PmlLimits) -> None:
        self._limits = limits
        self._modules = 0

    def schema(self, element: XmlElement) -> Schema:
        if element.tag != "schema":
            raise MalformedPml(element.line, element.describe(), "a schema document's root must be <schema>")
        check_attributes(element, required=("name",))
        name = check_name(element.attributes["name"], element.line, element.describe(), self._limits)
        scaffold_elements = [c for c in element.children if isinstance(c, XmlElement) and c.tag == "scaffold"]
        content = [c for c in element.children if not (isinstance(c, XmlElement) and c.tag == "scaffold")]
        children = self._content(content, in_module=False, in_role=False)
        _check_scope(children, element)
        if len(scaffold_elements) > self._limits.scaffolds_per_schema_max:
            raise PmlLimitExceeded(
                scaffold_elements[-1].line,
                element.describe(),
                f"{len(scaffold_elements)} scaffolds, over {self._limits.scaffolds_per_schema_max}",
            )
        scaffolds = tuple(parse_scaffold(s, self._limits) for s in scaffold_elements)
        schema = Schema(name, children, scaffolds, element.line)
        check_scaffolds(schema, scaffold_elements)
        return schema

    def _content(
        self, items: list[XmlElement | XmlText], *, in_module: bool, in_role: bool
    ) -> tuple[SchemaNode, ...]:
        nodes: list[SchemaNode] = []
        for item in items:
            if isinstance(item, XmlText):
                nodes.append(Text(item.text, item.line))
            else:
                nodes.append(self._element(item, in_module=in_module, in_role=in_role))
        return tuple(nodes)

    def _element(self, element: XmlElement, *, in_module: bool, in_role: bool) -> SchemaNode:
        where = element.describe()
        if element.tag == "module":
            return self._module(element, in_role=in_role)
        if element.tag == "param":
            if not in_module:
                raise ParamAtRoot(element.line, where, "a parameter must be inside a module")
            return self._param(element)
        if element.tag == "union":
            check_attributes(element, required=())
            members = []
            for child in element.children:
                if not (isinstance(child, XmlElement) and child.tag == "module"):
                    raise MalformedPml(child.line, where, "a union holds only <module> elements")
                members.append(self._module(child, in_role=in_role))
            if not members:
                raise MalformedPml(element.line, where, "a union needs at least one module")
            return ModuleUnion(tuple(members), element.line)
        if element.tag in ROLES:
            if in_role:
                raise MalformedPml(element.line, where, "role tags do not nest, not even through modules")
            check_attributes(element, required=())
            children = self._content(element.children, in_module=in_module, in_role=True)
            return RoleBlock(element.tag, children, element.line)  # type: ignore[arg-type]
        if element.tag == "scaffold":
            raise MalformedPml(element.line, where, "a scaffold is declared directly in <schema>")
        raise MalformedPml(element.line, where, f"unknown element <{element.tag}> in a schema")

    def _module(self, element: XmlElement, *, in_role: bool) -> Module:
        where = element.describe()
        check_attributes(element, required=("name",))
        name = check_name(element.attributes["name"], element.line, where, self._limits)
        self._modules += 1
        if self._modules > self._limits.modules_per_schema_max:
            raise PmlLimitExceeded(
                element.line, where, f"more than {self._limits.modules_per_schema_max} modules in the schema"
            )
        children = self._content(element.children, in_module=True, in_role=in_role)
        _check_scope(children, element)
        return Module(name, children, element.line)

    def _param(self, element: XmlElement) -> Param:
        where = element.describe()
        check_attributes(element, required=("name", "len"))
        name = check_name(element.attributes["name"], element.line, where, self._limits)
        if element.children:
            raise MalformedPml(element.line, where, "a parameter is an empty element")
        text = element.attributes["len"]
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise MalformedPml(element.line, where, f"len must be a positive integer, got {text!r}")
        if int(text) > self._limits.param_len_max:
            raise PmlLimitExceeded(element.line, where, f"len {text} is over {self._limits.param_len_max}")
        return Param(name, int(text), element.line)


def _check_scope(children: tuple[SchemaNode, ...], owner: XmlElement) -> None:
    """Child modules (through role tags and unions) and params of one module have distinct names."""
    modules = [m for slot in child_slots(children) for m in slot.members]
    for tag, kind, nodes in (("module", "module", modules), ("param", "parameter", params_of(children))):
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                where = f'<{tag} name="{node.name}">'
                raise DuplicateName(node.line, where, f"a second {kind} {node.name!r} in {owner.describe()}")
            seen.add(node.name)
