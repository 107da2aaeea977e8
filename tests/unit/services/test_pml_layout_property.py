"""Schema positions are consistent on generated schemas: a prompt that imports every module in
schema order (each union's longest member) with arguments filling their params serves every
position of the schema exactly once, each cached piece where it was encoded."""

from hypothesis import given, settings
from pml_fixtures import tag_template, word_tokens
from pml_strategies import schemas

from attnstore.prompt_modules import (
    Import,
    ModuleSegment,
    Prompt,
    SchemaLayout,
    SlotLayout,
    layout_prompt,
    layout_schema,
)
from attnstore.prompt_modules.names import ModulePath


def full_imports(layout: SchemaLayout, path: ModulePath) -> tuple[Import, ...]:
    imports = []
    for slot in (i for i in layout.modules[path].items if isinstance(i, SlotLayout)):
        name = max(slot.names, key=lambda n: layout.modules[(*path, n)].length)  # first longest
        child = layout.modules[(*path, name)]
        arguments = tuple((p.name, " ".join(["w"] * p.len)) for p in child.params)
        imports.append(Import(name, arguments, full_imports(layout, (*path, name))))
    return tuple(imports)


@settings(max_examples=60, deadline=None)
@given(schemas())
def test_importing_everything_in_order_serves_every_position_once(schema) -> None:  # type: ignore[no-untyped-def]
    layout = layout_schema(schema, word_tokens, tag_template)
    for module in layout.modules.values():
        parent = layout.modules[module.path[:-1]] if module.path else None
        assert parent is None or parent.start <= module.start <= module.end <= parent.end
    served = layout_prompt(layout, Prompt(schema.name, full_imports(layout, ())), word_tokens, tag_template)
    assert served.positions == tuple(range(layout.length))
    assert served.next_position == layout.length
    assert all(s.shift == 0 for s in served.segments if isinstance(s, ModuleSegment))
