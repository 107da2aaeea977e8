"""bench-modules' reordered prompts (the yardstick's own spread): each prompt of several
modules has a twin that imports the same modules with the same arguments and text, in
another order; document QA's keeps the document asked about last."""

from __future__ import annotations

from collections import Counter

import pytest
from transformers import AutoTokenizer

from attnstore.prompt_modules.nodes import Import, PromptNode, PromptRole, Text
from attnstore.prompt_modules.prompt_parser import parse_prompt
from bench.modules.run import quality_workloads
from bench.modules.workload import Case
from inference_worker.model_store import default_model_dir


def _imports(nodes: tuple[PromptNode, ...]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every import (name, arguments) in document order, nested ones after their parent."""
    found = []
    for node in nodes:
        if isinstance(node, Import):
            found.append((node.name, node.arguments))
        if isinstance(node, Import | PromptRole):
            found += _imports(node.children)
    return found


def _text(nodes: tuple[PromptNode, ...]) -> list[str]:
    return [
        part
        for node in nodes
        for part in (
            [node.text]
            if isinstance(node, Text)
            else []
            if isinstance(node, Import)
            else _text(node.children)
        )
    ]


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    workloads = quality_workloads(AutoTokenizer.from_pretrained(default_model_dir()), quick=True)
    return [case for make in workloads.values() for case in make()]


def test_every_reordered_prompt_imports_the_same_modules_in_another_order(cases: list[Case]) -> None:
    assert {case.workload for case in cases} == {"doc_qa", "code", "persona", "travel"}
    for case in cases:
        assert case.reordered is not None, case.label
        prompt, reordered = parse_prompt(case.prompt), parse_prompt(case.reordered)
        mine, theirs = _imports(prompt.children), _imports(reordered.children)
        assert Counter(mine) == Counter(theirs) and mine != theirs, case.label
        assert _text(prompt.children) == _text(reordered.children), case.label  # the question unchanged
        if case.workload == "doc_qa":
            assert mine[-1] == theirs[-1], case.label  # the document asked about stays last
