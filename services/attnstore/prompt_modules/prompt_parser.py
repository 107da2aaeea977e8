"""PML prompt documents to `Prompt` (syntax only: `check_prompt` binds it to its schema)."""

from __future__ import annotations

from attnstore.prompt_modules.errors import MalformedPml
from attnstore.prompt_modules.limits import DEFAULT_LIMITS, PmlLimits
from attnstore.prompt_modules.names import ROLES, check_name
from attnstore.prompt_modules.nodes import Import, Prompt, PromptNode, PromptRole, Text
from attnstore.prompt_modules.xml_tree import XmlElement, XmlText, check_attributes, parse_xml


def parse_prompt(document: str, limits: PmlLimits = DEFAULT_LIMITS) -> Prompt:
    """`<prompt schema="s">` with imports (`<doc1/>`, `<trip destination="Paris"><hotel/></trip>`),
    role tags and uncached text anywhere. Read `Prompt.schema` to find the schema to check it with."""
    root = parse_xml(
        document, bytes_max=limits.prompt_bytes_max, depth_max=limits.nesting_depth_max, kind="prompt"
    )
    if root.tag != "prompt":
        raise MalformedPml(root.line, root.describe(), "a prompt document's root must be <prompt>")
    check_attributes(root, required=("schema",))
    schema = check_name(
        root.attributes["schema"], root.line, f'<prompt schema="{root.attributes["schema"]}">', limits
    )
    return Prompt(schema, _content(root.children, limits, in_role=False), root.line)


def _content(
    items: list[XmlElement | XmlText], limits: PmlLimits, *, in_role: bool
) -> tuple[PromptNode, ...]:
    return tuple(
        Text(item.text, item.line) if isinstance(item, XmlText) else _element(item, limits, in_role=in_role)
        for item in items
    )


def _element(element: XmlElement, limits: PmlLimits, *, in_role: bool) -> PromptNode:
    where = f"<{element.tag}>"
    if element.tag in ROLES:
        if in_role:
            raise MalformedPml(element.line, where, "role tags do not nest")
        check_attributes(element, required=())
        return PromptRole(element.tag, _content(element.children, limits, in_role=True), element.line)  # type: ignore[arg-type]
    name = check_name(element.tag, element.line, where, limits)
    for argument in element.attributes:
        check_name(argument, element.line, where, limits)
    arguments = tuple(element.attributes.items())
    return Import(name, arguments, _content(element.children, limits, in_role=in_role), element.line)
