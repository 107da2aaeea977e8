"""The model store on tiny random-weight models: loading local directories, the model digest
(stable for the same files, different for any other weight or setting, cached), and the
once-only atomic conversion of a GGUF file, with its slow dequantizing step stood in for
(the real one runs in tests/integration/inference_worker/test_model_store.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerFast

from inference_worker import model_store
from inference_worker.model_store import (
    CONVERSION_FILE,
    DIGEST_FILE,
    ModelStoreError,
    converted_model_dir,
    default_gguf_path,
    load_model,
    model_digest,
)

# ---- loading ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_loads_a_local_model_with_its_tokenizer(
    tiny_model_dir: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, family: str
) -> None:
    loaded = load_model(tiny_model_dir(family), torch.float32, "cpu")

    assert loaded.config.model_type == family
    assert not loaded.model.training
    assert loaded.device == torch.device("cpu")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
    messages = [{"role": "user", "content": "hello paris"}]
    prompt = loaded.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    ids = prompt["input_ids"][0].tolist()
    saved = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    assert ids == saved["input_ids"]
    assert loaded.tokenizer.decode(ids) == "<|im_start|>user\nhello paris<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():
        logits = loaded.model(**prompt).logits  # [1, T, vocab]
    assert logits.shape == (1, len(ids), len(tiny_tokenizer))


def test_loads_in_the_requested_dtype(tiny_model_dir: Callable[..., Path]) -> None:
    loaded = load_model(tiny_model_dir(), torch.bfloat16, "cpu")

    assert loaded.dtype == torch.bfloat16
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_rejects_an_unsupported_model_family(tiny_model_dir: Callable[..., Path]) -> None:
    with pytest.raises(ModelStoreError, match="'gpt2' is not supported"):
        load_model(tiny_model_dir("gpt2"))


def test_rejects_a_directory_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelStoreError, match="no config.json"):
        load_model(tmp_path)
    with pytest.raises(ModelStoreError, match="safetensors"):
        model_digest(tmp_path)


# ---- the digest ---------------------------------------------------------------------------


def test_digest_is_the_same_for_the_same_files(tiny_model_dir: Callable[..., Path]) -> None:
    first = tiny_model_dir(seed=1)
    digest = model_digest(first)

    load_model(first)
    assert model_digest(first) == digest
    (first / DIGEST_FILE).unlink()
    assert model_digest(first) == digest  # recomputed, not only read back
    assert model_digest(tiny_model_dir(seed=1)) == digest  # same files elsewhere (another node)
    assert len(digest) == 64 and int(digest, 16) >= 0


def test_digest_is_the_same_in_another_process(tiny_model_dir: Callable[..., Path]) -> None:
    directory = tiny_model_dir()
    digest = model_digest(directory)
    (directory / DIGEST_FILE).unlink()

    script = "import sys; from pathlib import Path; from inference_worker.model_store import model_digest; "
    script += "print(model_digest(Path(sys.argv[1])))"
    other = subprocess.run(
        [sys.executable, "-c", script, str(directory)], capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == digest


def test_digest_changes_when_one_weight_changes(tiny_model_dir: Callable[..., Path]) -> None:
    directory = tiny_model_dir()
    digest = model_digest(directory)
    weights_path = directory / "model.safetensors"
    weights = load_file(weights_path)
    name = "model.layers.1.self_attn.k_proj.weight"
    weights[name][0, 0] = torch.nextafter(weights[name][0, 0], torch.tensor(1.0))  # one ulp

    save_file(weights, weights_path, metadata={"format": "pt"})

    assert model_digest(directory) != digest
    assert model_digest(tiny_model_dir(seed=1)) != digest  # other random weights


def test_digest_changes_when_the_config_changes(tiny_model_dir: Callable[..., Path]) -> None:
    directory = tiny_model_dir()
    digest = model_digest(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())

    config["rms_norm_eps"] = config["rms_norm_eps"] * 2
    config_path.write_text(json.dumps(config))
    assert model_digest(directory) != digest


def test_digest_ignores_formatting_and_bookkeeping_of_the_config(tiny_model_dir: Callable[..., Path]) -> None:
    directory = tiny_model_dir()
    digest = model_digest(directory)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())

    config["transformers_version"] = "0.0.1"
    config_path.write_text(json.dumps(dict(reversed(list(config.items()))), indent=7))
    assert model_digest(directory) == digest


def test_digest_is_hashed_once_until_a_file_changes(
    tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tiny_model_dir()
    computed: list[str] = []
    compute = model_store._compute_digest

    def counting_compute(config_path: Path, weights: list[Path]) -> str:
        computed.append(compute(config_path, weights))
        return computed[-1]

    monkeypatch.setattr(model_store, "_compute_digest", counting_compute)
    digest = model_digest(directory)

    assert model_digest(directory) == digest
    assert len(computed) == 1
    # Rewritten with its old mtime put back: the changed ctime still invalidates the cache.
    weights_path = directory / "model.safetensors"
    before = weights_path.stat()
    weights_path.write_bytes(weights_path.read_bytes())
    os.utime(weights_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert model_digest(directory) == digest
    assert len(computed) == 2


# ---- the conversion (its dequantizing step stood in for) ------------------------------------


class FakeConverter:
    """Stands in for `_convert_gguf`: copies a tiny model into the staging directory,
    counting calls; `fail_after_files` crashes part way through."""

    def __init__(self, source: Path, *, delay_seconds: float = 0.0) -> None:
        self.source = source
        self.calls = 0
        self.delay_seconds = delay_seconds
        self.fail_after_files: int | None = None

    def __call__(self, gguf_path: Path, out_dir: Path) -> None:
        self.calls += 1
        time.sleep(self.delay_seconds)  # holds the conversion lock for a while
        for index, path in enumerate(sorted(self.source.iterdir())):
            if self.fail_after_files is not None and index == self.fail_after_files:
                raise RuntimeError("crashed while converting")
            shutil.copy(path, out_dir / path.name)


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "package" / "Tiny.Q4_1.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(60))
    return path


@pytest.fixture
def converter(tiny_model_dir: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    fake = FakeConverter(tiny_model_dir())
    monkeypatch.setattr(model_store, "_convert_gguf", fake)
    return fake


def file_stamps(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_converts_once_then_reuses_the_conversion(
    fake_gguf: Path, converter: FakeConverter, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    model_dir = converted_model_dir(fake_gguf, cache_dir)
    stamps = file_stamps(model_dir)

    assert converted_model_dir(fake_gguf, cache_dir) == model_dir == cache_dir / "Tiny.Q4_1"
    assert converter.calls == 1
    assert file_stamps(model_dir) == stamps
    assert json.loads((model_dir / CONVERSION_FILE).read_text())["gguf_bytes"] == 64
    assert load_model(model_dir).config.model_type == "llama"
    assert sorted(p.name for p in cache_dir.iterdir()) == [".Tiny.Q4_1.lock", "Tiny.Q4_1"]


def test_a_crashed_conversion_leaves_nothing_that_loads(
    fake_gguf: Path, converter: FakeConverter, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    converter.fail_after_files = 2
    with pytest.raises(RuntimeError, match="crashed"):
        converted_model_dir(fake_gguf, cache_dir)
    assert not (cache_dir / "Tiny.Q4_1").exists()
    # A process killed mid-conversion leaves its staging directory: the next one removes it.
    leftover = cache_dir / ".Tiny.Q4_1.tmp-killed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")

    converter.fail_after_files = None
    model_dir = converted_model_dir(fake_gguf, cache_dir)
    assert not leftover.exists()
    assert (model_dir / CONVERSION_FILE).is_file()


def test_a_different_gguf_file_is_converted_again(
    fake_gguf: Path, converter: FakeConverter, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    model_dir = converted_model_dir(fake_gguf, cache_dir)
    fake_gguf.write_bytes(b"GGUF" + bytes(100))  # a new release of the package

    assert converted_model_dir(fake_gguf, cache_dir) == model_dir
    assert converter.calls == 2
    assert json.loads((model_dir / CONVERSION_FILE).read_text())["gguf_bytes"] == 104
    assert sorted(p.name for p in cache_dir.iterdir()) == [".Tiny.Q4_1.lock", "Tiny.Q4_1"]


def test_concurrent_starts_convert_once(fake_gguf: Path, converter: FakeConverter, tmp_path: Path) -> None:
    converter.delay_seconds = 0.2
    cache_dir = tmp_path / "cache"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(converted_model_dir(fake_gguf, cache_dir)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert results == [cache_dir / "Tiny.Q4_1"] * 3
    assert converter.calls == 1


def test_finds_the_default_models_gguf_file() -> None:
    path = default_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
