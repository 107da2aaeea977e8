"""Schema positions: modules at their absolute offsets, params reserving `len`, unions sharing
one start and spanning their longest member, nested modules inside their parent's span."""

from pml_fixtures import tag_template, word_tokens

from attnstore.prompt_modules import ParamLayout, PieceLayout, SlotLayout, layout_schema, parse_schema


def lay(document: str, render=tag_template):  # type: ignore[no-untyped-def]
    return layout_schema(parse_schema(document), word_tokens, render)


def test_modules_follow_each_other_at_absolute_offsets() -> None:
    layout = lay(
        '<schema name="s">w0 w1<module name="a">a0 a1 a2</module><module name="b">b0</module>w2</schema>'
    )
    assert [(p, m.start, m.length) for p, m in layout.modules.items()] == [
        ((), 0, 7),
        (("a",), 2, 3),
        (("b",), 5, 1),
    ]
    root = layout.modules[()]
    assert root.positions == (0, 1, 6) and root.token_ids == tuple(word_tokens("w0 w1 w2"))
    assert layout.length == 7


def test_a_param_reserves_len_positions_inside_its_module() -> None:
    layout = lay('<schema name="s"><module name="m">go to <param name="city" len="5"/> now</module></schema>')
    module = layout.modules[("m",)]
    assert module.items == (
        PieceLayout(0, "go to ", tuple(word_tokens("go to")), 0, 0),
        ParamLayout("city", 2, 5, 1),
        PieceLayout(1, " now", tuple(word_tokens("now")), 7, 2),
    )
    assert module.length == 8 and module.positions == (0, 1, 7)


def test_union_members_share_a_start_and_the_union_spans_the_longest() -> None:
    layout = lay(
        '<schema name="s"><union><module name="short">x</module><module name="long">y y y y</module></union>'
        '<module name="after">z</module></schema>'
    )
    assert layout.modules[("short",)].start == layout.modules[("long",)].start == 0
    assert layout.modules[("after",)].start == 4
    assert layout.modules[()].items[0] == SlotLayout(("short", "long"), True, 0, 4)


def test_nested_modules_lie_inside_their_parent() -> None:
    layout = lay(
        '<schema name="s">r<module name="a">a0<module name="b">b0 b1<module name="c">c0</module></module>a1</module></schema>'
    )
    a, b, c = layout.modules[("a",)], layout.modules[("a", "b")], layout.modules[("a", "b", "c")]
    assert (a.start, a.length) == (1, 5)
    assert (b.start, b.length) == (2, 3)
    assert (c.start, c.length) == (4, 1)
    assert a.positions == (1, 5)  # a's own KV skips its child's span
    assert list(layout.modules) == [(), ("a",), ("a", "b"), ("a", "b", "c")]


def test_role_tags_frame_their_content_with_the_template() -> None:
    layout = lay(
        '<schema name="s"><system>be brief</system><user><module name="q">why</module></user></schema>'
    )
    root = layout.modules[()]
    assert [p.text for p in root.pieces] == [" [system] be brief [/system]  [user] ", " [/user] "]
    assert layout.modules[("q",)].start == 5


def test_a_module_is_encoded_after_the_text_of_its_ancestors_before_it() -> None:
    layout = lay(
        '<schema name="s">r0 r1<module name="a">a0<module name="b">b0<module name="c">c0</module></module>'
        'a1<module name="d">d0</module></module>r2<module name="e">e0</module></schema>'
    )
    text = {path: [piece.text for piece in layout.context_pieces(path)] for path in layout.modules}
    assert text == {
        (): [],
        ("a",): ["r0 r1"],
        ("a", "b"): ["r0 r1", "a0"],
        ("a", "b", "c"): ["r0 r1", "a0", "b0"],
        ("a", "d"): ["r0 r1", "a0", "a1"],  # a's text after b's span precedes d too
        ("e",): ["r0 r1", "r2"],
    }
    positions = [p for piece in layout.context_pieces(("a", "d")) for p in range(piece.start, piece.end)]
    assert positions == [0, 1, 2, 5]
