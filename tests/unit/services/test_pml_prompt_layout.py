"""Serving a prompt: module pieces at schema positions (gaps where modules are omitted),
arguments on reserved positions, uncached text after what precedes it, re-positioning only
where earlier content has passed a piece's schema position, and scaffolds."""

from pml_fixtures import tag_template, word_tokens

from attnstore.prompt_modules import (
    ArgumentSegment,
    ModuleSegment,
    PromptLayout,
    TextSegment,
    layout_prompt,
    layout_schema,
    parse_prompt,
    parse_schema,
)

# Positions, one word per token:  0 r0 | 1-3 doc1 | 4-5 doc2 | 6 r1 | 7.. trip
DOCS = """<schema name="docs">r0<module name="doc1">d1 d1 d1</module><module name="doc2">d2 d2</module>r1
<module name="trip">fly to <param name="city" len="3"/> on
<union><module name="cheap">c</module><module name="luxury">l l<module name="spa">s s s</module></module></union>
end</module>
<scaffold name="both" modules="doc1 doc2"/>
</schema>"""


def serve(prompt: str, schema: str = DOCS, render=tag_template) -> PromptLayout:  # type: ignore[no-untyped-def]
    layout = layout_schema(parse_schema(schema), word_tokens, render)
    return layout_prompt(layout, parse_prompt(prompt), word_tokens, render)


def spans(served: PromptLayout) -> list[tuple[str, int, int]]:
    """(what, first position, token count) per segment."""
    out = []
    for s in served.segments:
        if isinstance(s, ModuleSegment):
            what = ".".join(s.path) or "root"
        elif isinstance(s, ArgumentSegment):
            what = f"{'.'.join(s.path)}:{s.param}"
        else:
            what = f"text {s.text.strip()!r}"
        out.append((what, s.start, len(s.token_ids)))
    return out


def test_omitted_modules_leave_gaps_and_the_root_text_is_always_served() -> None:
    served = serve('<prompt schema="docs"><doc2/></prompt>')
    assert spans(served) == [("root", 0, 1), ("doc2", 4, 2), ("root", 6, 1)]
    assert served.positions == (0, 4, 5, 6)  # doc1's positions 1-3 are a gap
    assert all(s.shift == 0 for s in served.segments if isinstance(s, ModuleSegment))
    assert served.modules == ((), ("doc2",))


def test_uncached_text_takes_the_positions_after_what_precedes_it() -> None:
    served = serve('<prompt schema="docs"><doc1/>why is that</prompt>')
    # No import follows: the text follows all the root's pieces, r1 included.
    assert spans(served) == [("root", 0, 1), ("doc1", 1, 3), ("root", 6, 1), ("text 'why is that'", 7, 3)]
    assert served.cached_tokens == 5 and served.computed_tokens == 3


def test_text_before_an_import_follows_the_schema_text_before_that_module() -> None:
    served = serve('<prompt schema="docs">a b<doc2/></prompt>')
    # r0 precedes doc2 in the schema, so it is served first; doc2 then fits its schema position.
    assert spans(served) == [("root", 0, 1), ("text 'a b'", 1, 2), ("doc2", 4, 2), ("root", 6, 1)]


def test_text_longer_than_the_gap_shifts_the_next_module() -> None:
    served = serve('<prompt schema="docs">a b c d e<doc2/></prompt>')
    assert spans(served) == [("root", 0, 1), ("text 'a b c d e'", 1, 5), ("doc2", 6, 2), ("root", 8, 1)]
    doc2 = served.segments[2]
    assert isinstance(doc2, ModuleSegment) and (doc2.schema_start, doc2.shift) == (4, 2)


def test_modules_out_of_schema_order_are_served_as_written() -> None:
    served = serve('<prompt schema="docs"><doc2/><doc1/></prompt>')
    assert spans(served) == [("root", 0, 1), ("doc2", 4, 2), ("doc1", 6, 3), ("root", 9, 1)]
    assert served.modules == ((), ("doc2",), ("doc1",))


def test_a_short_argument_leaves_the_rest_of_its_reserved_positions_empty() -> None:
    served = serve('<prompt schema="docs"><trip city="Oslo"><cheap/></trip></prompt>')
    # trip starts at 7: "fly to" 7-8, city reserves 9-11, "on" 12, union 13-17 (luxury with spa is 5), "end" 18
    assert spans(served) == [
        ("root", 0, 1),
        ("root", 6, 1),
        ("trip", 7, 2),
        ("trip:city", 9, 1),
        ("trip", 12, 1),
        ("trip.cheap", 13, 1),
        ("trip", 18, 1),
    ]
    argument = served.segments[3]
    assert isinstance(argument, ArgumentSegment) and argument.reserved == 3 and not argument.cached


def test_union_members_are_served_at_the_union_start_and_nested_modules_inside() -> None:
    served = serve('<prompt schema="docs"><trip city="Rome"><luxury><spa/></luxury></trip></prompt>')
    assert ("trip.luxury", 13, 2) in spans(served) and ("trip.luxury.spa", 15, 3) in spans(served)
    assert spans(served)[-1] == ("trip", 18, 1)


def test_text_after_the_last_import_follows_all_the_module_text() -> None:
    served = serve('<prompt schema="docs"><trip city="Rome">x</trip></prompt>')
    assert spans(served)[-3:] == [("trip", 12, 1), ("trip", 18, 1), ("text 'x'", 19, 1)]


def test_prompt_role_tags_are_framed_and_computed() -> None:
    served = serve('<prompt schema="docs"><doc1/><user>hi</user></prompt>')
    text = served.segments[-1]
    assert isinstance(text, TextSegment) and text.text == " [user] hi [/user] " and text.start == 7


def test_module_segments_index_the_module_kv() -> None:
    schema = layout_schema(parse_schema(DOCS), word_tokens, tag_template)
    served = layout_prompt(
        schema, parse_prompt('<prompt schema="docs"><trip city="Rome"/></prompt>'), word_tokens, tag_template
    )
    trip = schema.modules[("trip",)]
    for segment in (s for s in served.segments if isinstance(s, ModuleSegment) and s.path == ("trip",)):
        kv = trip.token_ids[segment.module_offset : segment.module_offset + len(segment.token_ids)]
        assert kv == segment.token_ids
        assert trip.positions[segment.module_offset] == segment.schema_start


def test_served_in_schema_order_every_cached_piece_is_at_its_encoded_position() -> None:
    served = serve(
        '<prompt schema="docs"><doc1/><doc2/><trip city="a b c"><luxury><spa/></luxury></trip></prompt>'
    )
    assert all(s.shift == 0 for s in served.segments if isinstance(s, ModuleSegment))
    assert served.positions == tuple(range(len(served.positions)))  # no gaps when everything is imported


def test_a_scaffold_serves_when_all_its_modules_are_imported() -> None:
    both = serve('<prompt schema="docs"><doc1/><doc2/></prompt>')
    assert both.scaffold == "both"
    assert {s.scaffold for s in both.segments if isinstance(s, ModuleSegment)} == {"both"}
    one = serve('<prompt schema="docs"><doc1/></prompt>')
    assert one.scaffold is None and all(
        s.scaffold is None for s in one.segments if isinstance(s, ModuleSegment)
    )


def test_modules_outside_the_scaffold_keep_their_own_kv() -> None:
    served = serve('<prompt schema="docs"><doc1/><doc2/><trip city="x"/></prompt>')
    by_path = {s.path: s.scaffold for s in served.segments if isinstance(s, ModuleSegment)}
    assert by_path == {(): "both", ("doc1",): "both", ("doc2",): "both", ("trip",): None}


def test_the_largest_usable_scaffold_wins() -> None:
    schema = DOCS.replace("</schema>", '<scaffold name="all" modules="doc1 doc2 trip"/></schema>')
    assert serve('<prompt schema="docs"><doc1/><doc2/><trip city="x"/></prompt>', schema).scaffold == "all"
    assert serve('<prompt schema="docs"><doc1/><doc2/></prompt>', schema).scaffold == "both"


def test_scaffold_pieces_are_what_it_encodes_in_position_order() -> None:
    layout = layout_schema(parse_schema(DOCS), word_tokens, tag_template)
    pieces = layout.scaffold_pieces("both")
    assert [(path, piece.start) for path, piece in pieces] == [
        ((), 0),
        (("doc1",), 1),
        (("doc2",), 4),
        ((), 6),
    ]


TRAVEL = """<schema name="travel">
  <system>You plan trips. </system>
  <module name="city-guide">Guide: museums, food and parks. </module>
  <module name="trip">Plan a trip to <param name="destination" len="3"/> for
    <union>
      <module name="solo">one person. </module>
      <module name="family">a family with two kids. </module>
    </union>
  </module>
  <scaffold name="guided-trip" modules="city-guide trip"/>
</schema>"""


def test_the_worked_example_of_the_docs() -> None:
    def template(role: str, content: str) -> str:
        return f"<{role}> {content} </{role}> "

    layout = layout_schema(parse_schema(TRAVEL), word_tokens, template)
    assert [(p, m.start, m.length) for p, m in layout.modules.items()] == [
        ((), 0, 23),
        (("city-guide",), 5, 5),
        (("trip",), 10, 13),
        (("trip", "solo"), 18, 2),
        (("trip", "family"), 18, 5),
    ]
    family = serve(
        '<prompt schema="travel"><trip destination="New York"><family/></trip><user>Any tips?</user></prompt>',
        TRAVEL,
        template,
    )
    assert spans(family) == [
        ("root", 0, 5),
        ("trip", 10, 4),
        ("trip:destination", 14, 2),
        ("trip", 17, 1),
        ("trip.family", 18, 5),
        ("text '<user> Any tips? </user>'", 23, 4),
    ]
    assert (family.cached_tokens, family.computed_tokens, family.next_position) == (15, 6, 27)
    long_turn = serve(
        '<prompt schema="travel"><user>Hello there, I need help with a long question first</user>'
        "<city-guide/></prompt>",
        TRAVEL,
        template,
    )
    guide = long_turn.segments[-1]
    assert isinstance(guide, ModuleSegment) and (guide.start, guide.shift) == (17, 12)
    both = serve(
        '<prompt schema="travel"><city-guide/><trip destination="Oslo"><solo/></trip></prompt>', TRAVEL
    )
    assert both.scaffold == "guided-trip"


def test_a_compact_layout_serves_everything_without_gaps() -> None:
    layout = layout_schema(parse_schema(DOCS), word_tokens, tag_template)
    prompt = parse_prompt('<prompt schema="docs"><trip city="Oslo"><cheap/></trip>why</prompt>')
    served = layout_prompt(layout, prompt, word_tokens, tag_template, compact=True)
    assert spans(served) == [
        ("root", 0, 1),
        ("root", 1, 1),  # r1 right after r0: docs omitted
        ("trip", 2, 2),
        ("trip:city", 4, 1),  # 1 token of 3 reserved
        ("trip", 5, 1),
        ("trip.cheap", 6, 1),  # the union's longer member takes no room
        ("trip", 7, 1),
        ("text 'why'", 8, 1),
    ]
    assert served.positions == tuple(range(9)) and served.next_position == 9
    shifts = [s.shift for s in served.segments if isinstance(s, ModuleSegment)]
    assert shifts == [0, -5, -5, -7, -7, -11]  # from the schema positions of the default layout
