"""`Schema` and `Prompt` back to PML text. The form is canonical (no added whitespace,
attributes in one order, scaffolds last), so it is also what the schema digest hashes."""

from __future__ import annotations

from attnstore.prompt_modules import nodes
from attnstore.prompt_modules.names import format_path

# "\r" would come back as "\n" (XML normalizes line ends); tabs and newlines in attributes as spaces.
_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})
_ATTRIBUTE_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\r": "&#13;", "\n": "&#10;", "\t": "&#9;"}
)


def print_schema(schema: nodes.Schema) -> str:
    parts = [f"<schema name={_quote(schema.name)}>"]
    parts.extend(_schema_node(node) for node in schema.children)
    parts.extend(
        f"<scaffold name={_quote(s.name)} modules={_quote(' '.join(format_path(p) for p in s.modules))}/>"
        for s in schema.scaffolds
    )
    parts.append("</schema>")
    return "".join(parts)


def print_prompt(prompt: nodes.Prompt) -> str:
    return f"<prompt schema={_quote(prompt.schema)}>{_prompt_nodes(prompt.children)}</prompt>"


def _schema_node(node: nodes.SchemaNode) -> str:
    if isinstance(node, nodes.Text):
        return node.text.translate(_TEXT_ESCAPES)
    if isinstance(node, nodes.Param):
        return f"<param name={_quote(node.name)} len={_quote(str(node.len))}/>"
    if isinstance(node, nodes.Module):
        return _module(node)
    if isinstance(node, nodes.ModuleUnion):
        return "<union>" + "".join(_module(m) for m in node.members) + "</union>"
    return _element(node.role, "", "".join(_schema_node(child) for child in node.children))


def _module(module: nodes.Module) -> str:
    content = "".join(_schema_node(child) for child in module.children)
    return _element("module", f" name={_quote(module.name)}", content)


def _prompt_nodes(children: tuple[nodes.PromptNode, ...]) -> str:
    return "".join(_prompt_node(node) for node in children)


def _prompt_node(node: nodes.PromptNode) -> str:
    if isinstance(node, nodes.Text):
        return node.text.translate(_TEXT_ESCAPES)
    if isinstance(node, nodes.PromptRole):
        return _element(node.role, "", _prompt_nodes(node.children))
    arguments = "".join(f" {name}={_quote(value)}" for name, value in node.arguments)
    return _element(node.name, arguments, _prompt_nodes(node.children))


def _element(tag: str, attributes: str, content: str) -> str:
    return f"<{tag}{attributes}>{content}</{tag}>" if content else f"<{tag}{attributes}/>"


def _quote(value: str) -> str:
    return f'"{value.translate(_ATTRIBUTE_ESCAPES)}"'
