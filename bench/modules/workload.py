"""The prompt-module benchmark's workloads, as PML (schemas and prompts), from real text.

- length sweep: one schema per length with one module of about N tokens (ShareGPT answers
  joined, cut at N tokens) and a short question as uncached text; the reference
  continuation is the text that follows the cut.
- document QA: long ShareGPT answers as the modules of one schema (documents); each prompt
  imports a seeded subset of them in a seeded order and asks the question that followed the
  last one in its conversation; the reference continuation is the dataset's answer to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from xml.sax.saxutils import escape

from transformers import PreTrainedTokenizerBase

from bench.common.sharegpt import seeded_chats

QUESTION = " Question: what is the main point of the text above? Answer:"


@dataclass(frozen=True)
class Case:
    workload: str
    label: str
    schema: str
    prompt: str
    reference: str  # text whose perplexity after the prompt is measured
    module_tokens: int  # of the imported modules (approximate: tokenized apart)


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
    if len(ids) < max(lengths) + 64:
        raise RuntimeError(f"only {len(ids)} tokens of text for a {max(lengths)}-token module")
    cases = []
    for length in lengths:
        module = tokenizer.decode(ids[:length])
        schema = f'<schema name="sweep{length}"><module name="text">{escape(module)}</module></schema>'
        prompt = f'<prompt schema="sweep{length}"><text/>{escape(QUESTION)}</prompt>'
        reference = tokenizer.decode(ids[length : length + 64])
        cases.append(Case("length", f"{length}", schema, prompt, reference, length))
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
        imports = "".join(f"<doc{i}/>" for i in chosen)
        prompt = (
            f'<prompt schema="docqa">{imports}{escape(" Question: " + last.question + " Answer:")}</prompt>'
        )
        tokens = sum(len(tokenizer.encode(found[i].text, add_special_tokens=False)) for i in chosen)
        cases.append(
            Case("doc_qa", f"q{number}:{'+'.join(map(str, chosen))}", schema, prompt, last.answer, tokens)
        )
    return cases
