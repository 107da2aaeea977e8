"""Every PML error is typed and names the line, the element and what is wrong."""

import pytest
from pml_fixtures import word_tokens

from attnstore import prompt_modules as pml
from attnstore.errors import InvalidArgument

SCHEMA = """<schema name="s">
<module name="trip">to <param name="city" len="2"/>
  <union>
    <module name="cheap">c</module>
    <module name="luxury">l<module name="spa">s</module></module>
  </union>
</module>
<module name="doc">d</module>
</schema>"""


def schema_error(
    document: str, kind: type[pml.PmlError], limits: pml.PmlLimits = pml.DEFAULT_LIMITS
) -> pml.PmlError:
    with pytest.raises(kind) as caught:
        pml.parse_schema(document, limits)
    return caught.value


def prompt_error(document: str, kind: type[pml.PmlError]) -> pml.PmlError:
    with pytest.raises(kind) as caught:
        pml.check_prompt(pml.parse_prompt(document), pml.parse_schema(SCHEMA))
    return caught.value


def assert_names(error: pml.PmlError, line: int, element: str, *words: str) -> None:
    assert isinstance(error, InvalidArgument)  # the server edge answers INVALID_ARGUMENT
    assert (error.line, error.element) == (line, element)
    assert str(error).startswith(f"line {line}, {element}: ")
    for word in words:
        assert word in error.problem, error.problem


SCHEMA_ERRORS: dict[type[pml.PmlError], list[tuple[str, int, str, tuple[str, ...]]]] = {
    pml.MalformedPml: [
        (
            '<schema name="s">\n<module name="a">\n</schema>',
            3,
            "document",
            ("malformed XML", "mismatched tag"),
        ),
        ("", 1, "document", ("malformed XML",)),
        ('<schema name="s"><module name="a" name="b"/></schema>', 1, "document", ("duplicate attribute",)),
        ('<!DOCTYPE x><schema name="s"/>', 1, "document", ("DOCTYPE",)),
        ('<?php x?><schema name="s"/>', 1, "document", ("processing instruction",)),
        ('<?xml version="1.0" encoding="latin-1"?><schema name="s"/>', 1, "document", ("'latin-1'",)),
        ('<prompt schema="s"/>', 1, "<prompt>", ("root must be <schema>",)),
        (
            '<schema name="s">\n<modul name="a"/></schema>',
            2,
            '<modul name="a">',
            ("unknown element <modul>",),
        ),
        ("<schema/>", 1, "<schema>", ("missing attribute 'name'",)),
        (
            '<schema name="s"><module name="a" size="3"/></schema>',
            1,
            '<module name="a">',
            ("unknown attribute 'size'",),
        ),
        (
            '<schema name="s"><module name="a"><param name="p"/></module></schema>',
            1,
            '<param name="p">',
            ("'len'",),
        ),
        (
            '<schema name="s"><module name="a"><param name="p" len="0"/></module></schema>',
            1,
            '<param name="p">',
            ("positive",),
        ),
        (
            '<schema name="s"><module name="a"><param name="p" len="x"/></module></schema>',
            1,
            '<param name="p">',
            ("'x'",),
        ),
        (
            '<schema name="s"><union>\ntext<module name="a"/></union></schema>',
            2,
            "<union>",
            ("only <module>",),
        ),
        ('<schema name="s"><union></union></schema>', 1, "<union>", ("at least one",)),
        ('<schema name="s"><user><system/></user></schema>', 1, "<system>", ("do not nest",)),
        (
            '<schema name="s"><user><module name="a"><system/></module></user></schema>',
            1,
            "<system>",
            ("do not nest",),
        ),
        (
            '<schema name="s"><module name="a"><scaffold name="x" modules="a"/></module></schema>',
            1,
            '<scaffold name="x">',
            ("directly in <schema>",),
        ),
        (
            '<schema name="s"><module name="a"><param name="p" len="1">x</param></module></schema>',
            1,
            '<param name="p">',
            ("empty",),
        ),
    ],
    pml.DuplicateName: [
        (
            '<schema name="s">\n<module name="a"/>\n<module name="a"/></schema>',
            3,
            '<module name="a">',
            ("second module 'a'", "<schema"),
        ),
        (
            '<schema name="s"><module name="a"/><union>\n<module name="a"/></union></schema>',
            2,
            '<module name="a">',
            ("second module",),
        ),
        (
            '<schema name="s"><module name="a"/><user>\n<module name="a"/></user></schema>',
            2,
            '<module name="a">',
            ("second module",),
        ),
        (
            '<schema name="s"><module name="m"><param name="p" len="1"/>\n<param name="p" len="2"/></module></schema>',
            2,
            '<param name="p">',
            ("second parameter 'p'", '<module name="m">'),
        ),
        (
            '<schema name="s"><module name="a"/>\n<scaffold name="x" modules="a"/><scaffold name="x" modules="a"/></schema>',
            2,
            '<scaffold name="x">',
            ("second scaffold",),
        ),
        (
            '<schema name="s"><module name="a"/><scaffold name="x" modules="a a"/></schema>',
            1,
            '<scaffold name="x">',
            ("listed twice",),
        ),
    ],
}


@pytest.mark.parametrize(
    ("kind", "document", "line", "element", "words"),
    [(kind, *case) for kind, cases in SCHEMA_ERRORS.items() for case in cases],
)
def test_malformed_documents_and_duplicate_names(
    kind: type[pml.PmlError], document: str, line: int, element: str, words: tuple[str, ...]
) -> None:
    assert_names(schema_error(document, kind), line, element, *words)


@pytest.mark.parametrize(
    ("document", "element", "words"),
    [
        ('<schema name="s"><module name="a.b"/></schema>', '<module name="a.b">', ("illegal name 'a.b'",)),
        ('<schema name="s"><module name="9lives"/></schema>', '<module name="9lives">', ("illegal name",)),
        (
            '<schema name="s"><module name="caf\u00e9"/></schema>',
            '<module name="caf\u00e9">',
            ("illegal name",),
        ),
        ('<schema name="s"><module name=""/></schema>', '<module name="">', ("illegal name",)),
        ('<schema name="s"><module name="user"/></schema>', '<module name="user">', ("reserved",)),
        (
            '<schema name="s"><module name="a"><param name="Module" len="1"/></module></schema>',
            '<param name="Module">',
            ("reserved",),
        ),
        ('<schema name="bad name"/>', '<schema name="bad name">', ("illegal name",)),
        (
            '<schema name="s"><scaffold name="x" modules="a..b"/></schema>',
            '<scaffold name="x">',
            ("illegal name ''",),
        ),
    ],
)
def test_illegal_names(document: str, element: str, words: tuple[str, ...]) -> None:
    assert_names(schema_error(document, pml.IllegalName), 1, element, *words)


def test_a_name_over_the_limit_is_illegal() -> None:
    error = schema_error(f'<schema name="{"x" * 9}"/>', pml.IllegalName, pml.PmlLimits(name_chars_max=8))
    assert_names(error, 1, f'<schema name="{"x" * 9}">', "9 characters, over 8")


def test_same_name_at_different_levels_is_allowed() -> None:
    pml.parse_schema('<schema name="s"><module name="a"><module name="a"/></module></schema>')


@pytest.mark.parametrize(
    "document",
    [
        '<schema name="s">\n<param name="p" len="1"/></schema>',
        '<schema name="s">\n<user><param name="p" len="1"/></user></schema>',
    ],
)
def test_a_parameter_at_the_root(document: str) -> None:
    assert_names(schema_error(document, pml.ParamAtRoot), 2, '<param name="p">', "inside a module")


@pytest.mark.parametrize(
    ("document", "limits", "line", "element", "words"),
    [
        ('<schema name="s"/>', pml.PmlLimits(schema_bytes_max=10), 0, "<schema>", ("18 bytes, over 10",)),
        (
            '<schema name="s"><module name="a"/>\n<module name="b"/></schema>',
            pml.PmlLimits(modules_per_schema_max=1),
            2,
            '<module name="b">',
            ("more than 1 modules",),
        ),
        (
            '<schema name="s"><module name="a"><param name="p" len="9"/></module></schema>',
            pml.PmlLimits(param_len_max=8),
            1,
            '<param name="p">',
            ("len 9 is over 8",),
        ),
        (
            '<schema name="s"><module name="a">\n<module name="b"/></module></schema>',
            pml.PmlLimits(nesting_depth_max=2),
            2,
            '<module name="b">',
            ("deeper than 2",),
        ),
        (
            '<schema name="s"><module name="a"/><scaffold name="x" modules="a"/>\n<scaffold name="y" modules="a"/></schema>',
            pml.PmlLimits(scaffolds_per_schema_max=1),
            2,
            '<schema name="s">',
            ("2 scaffolds, over 1",),
        ),
    ],
)
def test_limits(
    document: str, limits: pml.PmlLimits, line: int, element: str, words: tuple[str, ...]
) -> None:
    assert_names(schema_error(document, pml.PmlLimitExceeded, limits), line, element, *words)


def test_prompt_size_limit() -> None:
    with pytest.raises(pml.PmlLimitExceeded) as caught:
        pml.parse_prompt('<prompt schema="s"/>', pml.PmlLimits(prompt_bytes_max=8))
    assert_names(caught.value, 0, "<prompt>", "20 bytes, over 8")


@pytest.mark.parametrize(
    ("document", "kind", "element", "words"),
    [
        (
            '<schema name="s"><module name="a"/><scaffold name="x" modules="b"/></schema>',
            pml.UnknownModule,
            '<scaffold name="x">',
            ("no module 'b'",),
        ),
        (
            SCHEMA.replace("</schema>", '<scaffold name="x" modules="trip.luxury"/></schema>'),
            pml.MalformedPml,
            '<scaffold name="x">',
            ("without its parent 'trip'",),
        ),
        (
            SCHEMA.replace(
                "</schema>", '<scaffold name="x" modules="trip trip.cheap trip.luxury"/></schema>'
            ),
            pml.UnionConflict,
            '<scaffold name="x">',
            ("one union",),
        ),
    ],
)
def test_scaffold_errors(
    document: str, kind: type[pml.PmlError], element: str, words: tuple[str, ...]
) -> None:
    error = schema_error(document, kind)
    assert error.element == element and all(w in error.problem for w in words)


def test_prompt_syntax_errors() -> None:
    with pytest.raises(pml.MalformedPml) as caught:
        pml.parse_prompt('<schema name="s"/>')
    assert_names(caught.value, 1, '<schema name="s">', "root must be <prompt>")
    with pytest.raises(pml.IllegalName) as illegal:
        pml.parse_prompt('<prompt schema="s">\n<doc bad-arg.x="1"/></prompt>')
    assert_names(illegal.value, 2, "<doc>", "illegal name 'bad-arg.x'")
    with pytest.raises(pml.MalformedPml) as nested:
        pml.parse_prompt('<prompt schema="s"><user><doc><user/></doc></user></prompt>')
    assert_names(nested.value, 1, "<user>", "do not nest")


@pytest.mark.parametrize(
    ("document", "kind", "line", "element", "words"),
    [
        (
            '<prompt schema="s">\n<nope/></prompt>',
            pml.UnknownModule,
            2,
            "<nope>",
            ("no module 'nope' in the schema root",),
        ),
        (
            '<prompt schema="s">\n<spa/></prompt>',
            pml.UnknownModule,
            2,
            "<spa>",
            ("declared as trip.luxury.spa",),
        ),
        (
            '<prompt schema="s"><doc>\n<cheap/></doc></prompt>',
            pml.UnknownModule,
            2,
            "<cheap>",
            ("in module 'doc'",),
        ),
        (
            '<prompt schema="s"><trip city="x"><cheap/>\n<luxury/></trip></prompt>',
            pml.UnionConflict,
            2,
            "<luxury>",
            ("'luxury' and 'cheap'", "one union"),
        ),
        (
            '<prompt schema="s"><doc/><user>\n<doc/></user></prompt>',
            pml.DuplicateName,
            2,
            "<doc>",
            ("imported twice",),
        ),
        (
            '<prompt schema="s">\n<trip/></prompt>',
            pml.ArgumentError,
            2,
            "<trip>",
            ("missing argument 'city'",),
        ),
        (
            '<prompt schema="s">\n<trip city="x" town="y"/></prompt>',
            pml.ArgumentError,
            2,
            "<trip>",
            ("no parameter 'town'",),
        ),
        ('<prompt schema="other"/>', pml.SchemaMismatch, 1, '<prompt schema="other">', ("schema 's'",)),
    ],
)
def test_prompt_binding_errors(
    document: str, kind: type[pml.PmlError], line: int, element: str, words: tuple[str, ...]
) -> None:
    assert_names(prompt_error(document, kind), line, element, *words)


def test_an_argument_longer_than_len() -> None:
    schema = pml.layout_schema(pml.parse_schema(SCHEMA), word_tokens)
    prompt = pml.parse_prompt('<prompt schema="s">\n<trip city="New York City"/></prompt>')
    with pytest.raises(pml.ArgumentTooLong) as caught:
        pml.layout_prompt(schema, prompt, word_tokens)
    assert_names(caught.value, 2, "<trip>", "argument 'city' is 3 tokens, over its len=2")
