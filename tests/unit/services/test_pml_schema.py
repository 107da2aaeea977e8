"""PML schemas and prompts parse into the typed tree, every element included."""

import subprocess
import sys

from attnstore.prompt_modules import (
    Import,
    Module,
    ModuleUnion,
    Param,
    Prompt,
    PromptRole,
    RoleBlock,
    Scaffold,
    Schema,
    Text,
    module_paths,
    parse_prompt,
    parse_schema,
)

TRAVEL = """<schema name="travel">
  <system>You plan trips.</system>
  <module name="trip">Plan a trip to <param name="destination" len="4"/>.
    <union>
      <module name="cheap">Cheap hotels.</module>
      <module name="luxury">Five-star hotels<module name="spa">with a spa</module></module>
    </union>
  </module>
  <user><module name="doc">A document.</module>Answer briefly.</user>
  <scaffold name="everything" modules="trip doc"/>
</schema>"""


def test_every_schema_element_parses_into_its_node() -> None:
    schema = parse_schema(TRAVEL)
    assert schema == Schema(
        "travel",
        (
            RoleBlock("system", (Text("You plan trips."),)),
            Module(
                "trip",
                (
                    Text("Plan a trip to "),
                    Param("destination", 4),
                    Text(".\n    "),
                    ModuleUnion(
                        (
                            Module("cheap", (Text("Cheap hotels."),)),
                            Module(
                                "luxury", (Text("Five-star hotels"), Module("spa", (Text("with a spa"),)))
                            ),
                        )
                    ),
                ),
            ),
            RoleBlock("user", (Module("doc", (Text("A document."),)), Text("Answer briefly."))),
        ),
        (Scaffold("everything", (("trip",), ("doc",))),),
    )


def test_line_numbers_are_kept_for_messages() -> None:
    schema = parse_schema(TRAVEL)
    trip = schema.children[1]
    assert isinstance(trip, Module) and trip.line == 3
    assert isinstance(trip.children[3], ModuleUnion) and trip.children[3].line == 4
    assert schema.scaffolds[0].line == 10


def test_text_is_verbatim_and_whitespace_between_elements_is_layout() -> None:
    schema = parse_schema(
        '<schema name="s">\n  <module name="a">  two  spaces &amp; &lt;tags&gt; </module>\n</schema>'
    )
    assert schema.children == (Module("a", (Text("  two  spaces & <tags> "),)),)


def test_comments_and_cdata_are_ordinary_xml() -> None:
    schema = parse_schema(
        '<schema name="s"><!-- note --><module name="a"><![CDATA[x < y]]></module></schema>'
    )
    assert schema.children == (Module("a", (Text("x < y"),)),)


def test_a_prompt_imports_nests_passes_arguments_and_adds_text() -> None:
    prompt = parse_prompt(
        '<prompt schema="travel"><trip destination="Paris"><luxury><spa/></luxury></trip>'
        "<user>Where should I stay?</user> Thanks.</prompt>"
    )
    assert prompt == Prompt(
        "travel",
        (
            Import("trip", (("destination", "Paris"),), (Import("luxury", (), (Import("spa", (), ()),)),)),
            PromptRole("user", (Text("Where should I stay?"),)),
            Text(" Thanks."),
        ),
    )
    first = prompt.children[0]
    assert isinstance(first, Import) and first.argument_map() == {"destination": "Paris"}


def test_module_paths_lists_every_module_in_document_order() -> None:
    assert module_paths(parse_schema(TRAVEL)) == (
        ("trip",),
        ("trip", "cheap"),
        ("trip", "luxury"),
        ("trip", "luxury", "spa"),
        ("doc",),
    )


def test_arguments_keep_escaped_line_ends() -> None:
    prompt = parse_prompt('<prompt schema="s"><doc note="a&#10;b &quot;c&quot;"/></prompt>')
    assert prompt.children == (Import("doc", (("note", 'a\nb "c"'),), ()),)


def test_the_package_imports_no_model_library() -> None:
    code = "import sys, attnstore.prompt_modules; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
