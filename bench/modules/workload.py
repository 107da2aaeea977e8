"""The prompt-module benchmark's workloads, as PML (schemas and prompts), from real text.

- length sweep: one schema per length with one module of about N tokens (ShareGPT answers
  joined, cut at N tokens) and a short question as uncached text; the reference
  continuation is the text that follows the cut.
- document QA: long ShareGPT answers as the modules of one schema (documents); each prompt
  imports a seeded subset of them in a seeded order and asks the question that followed the
  last one in its conversation; the reference continuation is the dataset's answer to it.
- the paper's three schemas (code generation, personalization, travel planning), below.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from xml.sax.saxutils import escape

from transformers import PreTrainedTokenizerBase

from bench.common.sharegpt import seeded_chats

QUESTION = " Question: what is the main point of the text above? Answer:"
# The reference tokens a full run scores per prompt (at most; a dataset answer may be
# shorter): at 32 one prompt's perplexity moved 5.5% with its modules merely reordered, at
# 128 1.3% (docs/benchmarks.md, twelfth session).
REFERENCE_TOKENS = 128


@dataclass(frozen=True)
class Case:
    workload: str
    label: str
    schema: str
    prompt: str
    reference: str  # text whose perplexity after the prompt is measured
    # The same prompt with its modules imported in another order, a change that keeps its
    # meaning: the full prefill's perplexity after it is the measure's own spread (None: one module).
    reordered: str | None = None


@dataclass(frozen=True)
class Document:
    text: str
    question: str  # the next user message of its conversation
    answer: str  # the dataset's answer to it


def documents(
    tokenizer: PreTrainedTokenizerBase, *, count: int, min_tokens: int, max_tokens: int, seed: int
) -> list[Document]:
    """Long assistant messages followed by a user question and its answer."""
    found: list[Document] = []
    for _, messages in seeded_chats(seed, min_messages=4):
        for index in range(1, len(messages) - 2, 2):  # an answer, then a question and its answer
            text = messages[index]["content"]
            tokens = len(tokenizer.encode(text, add_special_tokens=False))
            if min_tokens <= tokens <= max_tokens:
                found.append(
                    Document(text, messages[index + 1]["content"][:400], messages[index + 2]["content"])
                )
                break
        if len(found) == count:
            return found
    raise RuntimeError(f"only {len(found)} documents of {min_tokens}..{max_tokens} tokens")


def length_sweep(tokenizer: PreTrainedTokenizerBase, lengths: list[int], seed: int) -> list[Case]:
    pool = " ".join(
        d.text for d in documents(tokenizer, count=12, min_tokens=300, max_tokens=2000, seed=seed)
    )
    ids = tokenizer.encode(pool, add_special_tokens=False)
    if len(ids) < max(lengths) + REFERENCE_TOKENS:
        raise RuntimeError(f"only {len(ids)} tokens of text for a {max(lengths)}-token module")
    cases = []
    for length in lengths:
        module = tokenizer.decode(ids[:length])
        schema = f'<schema name="sweep{length}"><module name="text">{escape(module)}</module></schema>'
        prompt = f'<prompt schema="sweep{length}"><text/>{escape(QUESTION)}</prompt>'
        reference = tokenizer.decode(ids[length : length + REFERENCE_TOKENS])
        cases.append(Case("length", f"{length}", schema, prompt, reference))
    return cases


def doc_qa(
    tokenizer: PreTrainedTokenizerBase, *, docs: int, prompts: int, per_prompt: int, seed: int
) -> list[Case]:
    found = documents(tokenizer, count=docs, min_tokens=250, max_tokens=700, seed=seed + 1)
    modules = "".join(f'<module name="doc{i}">{escape(d.text)}\n</module>' for i, d in enumerate(found))
    schema = f'<schema name="docqa">Documents:\n{modules}</schema>'
    rng = random.Random(seed)
    cases = []
    for number in range(prompts):
        chosen = rng.sample(range(docs), per_prompt)  # a subset, in a random order
        last = found[chosen[-1]]
        question = escape(" Question: " + last.question + " Answer:")

        def prompt(order: list[int], question: str = question) -> str:
            return f'<prompt schema="docqa">{"".join(f"<doc{i}/>" for i in order)}{question}</prompt>'

        label = f"q{number}:{'+'.join(map(str, chosen))}"
        swapped = [chosen[1], chosen[0], *chosen[2:]]  # the document asked about stays last
        cases.append(Case("doc_qa", label, schema, prompt(chosen), last.answer, prompt(swapped)))
    return cases


# The paper's schemas, rebuilt (Prompt Cache, MLSys'24, section 5): code generation
# (source files as modules), personalization (unions of traits) and travel planning (a
# parameter and nested unions).

CODE_FILES = ("layout.py", "prompt_layout.py", "identity.py", "printer.py", "names.py")
CODE_TARGET = "structure.py"  # the file continued after the imported ones (uncached)
CODE_DIR = Path(__file__).resolve().parents[2] / "services" / "attnstore" / "prompt_modules"

TRAITS = {
    "age": ("a teenager", "a student in their twenties", "a parent in their forties", "retired", "a child"),
    "job": ("a nurse", "a software engineer", "a farmer", "a history teacher", "a chef"),
    "interest": ("football", "classical music", "gardening", "astronomy", "video games"),
    "tone": ("formal", "friendly", "humorous", "concise", "encouraging"),
    "detail": ("one sentence", "a short paragraph", "a numbered list", "a detailed essay", "a table"),
    "place": ("Brazil", "Japan", "Kenya", "Canada", "Germany"),
}


def code_generation(
    tokenizer: PreTrainedTokenizerBase, *, prompts: int, file_tokens: int, seed: int
) -> list[Case]:
    """Five source files (this repository's PML package, each cut at `file_tokens`) as
    modules; a prompt imports three in a seeded order, then the start of a sixth file
    (uncached) whose next lines are the reference."""

    def cut(name: str, tokens: int, skip: int = 0) -> str:
        ids = tokenizer.encode((CODE_DIR / name).read_text(), add_special_tokens=False)
        return tokenizer.decode(ids[skip : skip + tokens])

    modules = "".join(
        f'<module name="{name.removesuffix(".py")}"># file: {name}\n{escape(cut(name, file_tokens))}\n</module>'
        for name in CODE_FILES
    )
    schema = f'<schema name="code">A Python package, file by file.\n{modules}</schema>'
    opening, reference = cut(CODE_TARGET, 96), cut(CODE_TARGET, REFERENCE_TOKENS, skip=96)
    rng = random.Random(seed)
    cases = []
    for number, subset in enumerate(rng.sample(list(combinations(CODE_FILES, 3)), prompts)):
        chosen = rng.sample(subset, 3)  # distinct subsets, each in a seeded order

        def prompt(order: list[str]) -> str:
            imports = "".join(f"<{name.removesuffix('.py')}/>" for name in order)
            return f'<prompt schema="code">{imports}{escape(f"# file: {CODE_TARGET}" + chr(10) + opening)}</prompt>'

        label = f"c{number}:" + "+".join(name[:4] for name in chosen)
        cases.append(Case("code", label, schema, prompt(chosen), reference, prompt(chosen[::-1])))
    return cases


def personalization(tokenizer: PreTrainedTokenizerBase, *, prompts: int, seed: int) -> list[Case]:
    """Six unions of five traits (one sentence each); a prompt picks one trait of each and
    asks a ShareGPT question, whose dataset answer is the reference."""
    unions = "".join(
        "<union>"
        + "".join(
            f'<module name="{kind}{index}">The user {"is" if kind in ("age", "job") else "likes"} '
            f"{_trait_text(kind, value)}. </module>"
            for index, value in enumerate(values)
        )
        + "</union>"
        for kind, values in TRAITS.items()
    )
    schema = f'<schema name="persona"><system>You answer for one user. What you know of them: {unions}</system></schema>'
    asked = documents(tokenizer, count=prompts, min_tokens=100, max_tokens=700, seed=seed + 2)
    rng = random.Random(seed)
    cases = []
    for number, document in enumerate(asked):
        chosen = {kind: rng.randrange(len(values)) for kind, values in TRAITS.items()}
        imports = [f"<{kind}{index}/>" for kind, index in chosen.items()]
        user = f"<user>{escape(document.question)}</user>"
        prompt, reordered = (
            f'<prompt schema="persona">{"".join(order)}{user}</prompt>' for order in (imports, imports[::-1])
        )
        label = f"p{number}:" + "".join(str(index) for index in chosen.values())
        cases.append(Case("persona", label, schema, prompt, document.answer, reordered))
    return cases


def _trait_text(kind: str, value: str) -> str:
    if kind == "tone":
        return f"answers in a {value} tone"
    if kind == "detail":
        return f"answers as {value}"
    if kind == "place":
        return f"news from {value}, where they live"
    return value


TRAVEL_SCHEMA = """<schema name="travel"><system>You plan trips. </system>
<module name="guide">City guide: {guide}
</module>
<module name="trip">Plan a trip to <param name="destination" len="8"/> for <union>
<module name="solo">one traveller. <union>
<module name="budget">Keep it cheap: hostels, night buses, free museums and street food. </module>
<module name="luxury">Spare no expense: five-star hotels, private guides and fine dining. </module>
</union></module>
<module name="family">a family with two young children. <union>
<module name="relaxed">Keep the days slow: parks, beaches, long lunches and early nights. </module>
<module name="active">Fill the days: hikes, bike tours, zoos and science museums. </module>
</union></module>
</union></module></schema>"""
TRAVEL_CHOICES = (
    ("Lisbon", "solo", "budget"),
    ("Kyoto", "family", "active"),
    ("Cape Town", "solo", "luxury"),
    ("Vancouver", "family", "relaxed"),
)


def travel(tokenizer: PreTrainedTokenizerBase, *, prompts: int, seed: int) -> list[Case]:
    """A city guide (a long ShareGPT answer) and a trip module with a destination parameter
    and nested unions (who travels, then how); the question and reference as document QA's."""
    guide, *asked = documents(tokenizer, count=prompts + 1, min_tokens=250, max_tokens=700, seed=seed + 3)
    schema = TRAVEL_SCHEMA.format(guide=escape(guide.text))
    cases = []
    for number, document in enumerate(asked):
        city, who, how = TRAVEL_CHOICES[number % len(TRAVEL_CHOICES)]
        trip = f'<trip destination="{city}"><{who}><{how}/></{who}></trip>'
        user = f"<user>{escape(document.question)}</user>"
        prompt, reordered = (
            f'<prompt schema="travel">{order}{user}</prompt>'
            for order in (f"<guide/>{trip}", f"{trip}<guide/>")
        )
        cases.append(Case("travel", f"t{number}:{who}-{how}", schema, prompt, document.answer, reordered))
    return cases
