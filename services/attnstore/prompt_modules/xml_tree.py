"""A small element tree with line numbers, built by expat (the standard library's XML parser;
`xml.etree` drops line numbers). Whitespace-only text between elements is layout and dropped;
DOCTYPEs, entity declarations and processing instructions are refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.parsers import expat

from attnstore.prompt_modules.errors import MalformedPml, PmlLimitExceeded


@dataclass
class XmlText:
    text: str
    line: int


@dataclass
class XmlElement:
    tag: str
    attributes: dict[str, str]
    line: int
    children: list[XmlElement | XmlText] = field(default_factory=list)

    def describe(self) -> str:
        """The element as written in an error message: `<module name="doc">`."""
        name = self.attributes.get("name")
        return f'<{self.tag} name="{name}">' if name is not None else f"<{self.tag}>"


class _TreeBuilder:
    def __init__(self, parser: expat.XMLParserType, depth_max: int) -> None:
        self._parser = parser
        self._depth_max = depth_max
        self._stack: list[XmlElement] = []
        self._text: list[str] = []
        self._text_line = 0
        self.root: XmlElement | None = None

    def start(self, tag: str, attributes: list[str]) -> None:
        self._flush_text()
        line = self._parser.CurrentLineNumber
        element = XmlElement(tag, dict(zip(attributes[::2], attributes[1::2], strict=True)), line)
        if len(self._stack) >= self._depth_max:
            raise PmlLimitExceeded(
                line, element.describe(), f"nesting deeper than {self._depth_max} elements"
            )
        if self._stack:
            self._stack[-1].children.append(element)
        else:
            self.root = element
        self._stack.append(element)

    def end(self, tag: str) -> None:
        self._flush_text()
        self._stack.pop()

    def characters(self, data: str) -> None:
        if not self._text:
            self._text_line = self._parser.CurrentLineNumber
        self._text.append(data)

    def _flush_text(self) -> None:
        text = "".join(self._text)
        self._text.clear()
        if self._stack and text.strip():
            # The line of its first visible character, where a reader looks for it.
            line = self._text_line + text[: len(text) - len(text.lstrip())].count("\n")
            self._stack[-1].children.append(XmlText(text, line))

    def declaration(self, version: str, encoding: str | None, standalone: int) -> None:
        # The document arrives as text and is parsed as UTF-8; another declared encoding would
        # make expat decode it a second time, differently.
        if encoding is not None and encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            self.refuse(f"encoding {encoding!r} (documents are UTF-8)")

    def refuse(self, what: str) -> None:
        raise MalformedPml(self._parser.CurrentLineNumber, "document", f"{what} is not allowed in PML")


def parse_xml(document: str, *, bytes_max: int, depth_max: int, kind: str) -> XmlElement:
    """The document's root element; `kind` ("schema", "prompt") names it in size errors."""
    data = document.encode("utf-8")
    if len(data) > bytes_max:
        raise PmlLimitExceeded(0, f"<{kind}>", f"document is {len(data)} bytes, over {bytes_max}")
    parser = expat.ParserCreate()
    parser.ordered_attributes = True
    builder = _TreeBuilder(parser, depth_max)
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.characters
    parser.XmlDeclHandler = builder.declaration
    parser.StartDoctypeDeclHandler = lambda *_: builder.refuse("a DOCTYPE")
    parser.EntityDeclHandler = lambda *_: builder.refuse("an entity declaration")
    parser.ProcessingInstructionHandler = lambda *_: builder.refuse("a processing instruction")
    try:
        parser.Parse(data, True)
    except expat.ExpatError as exc:
        raise MalformedPml(exc.lineno, "document", f"malformed XML: {expat.ErrorString(exc.code)}") from None
    if builder.root is None:
        raise MalformedPml(1, "document", "no root element")
    return builder.root


def check_attributes(element: XmlElement, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    for attribute in element.attributes:
        if attribute not in required and attribute not in optional:
            raise MalformedPml(element.line, element.describe(), f"unknown attribute {attribute!r}")
    for attribute in required:
        if attribute not in element.attributes:
            raise MalformedPml(element.line, element.describe(), f"missing attribute {attribute!r}")
