"""oneDNN linear layers on the CPU: where the probe says oneDNN runs the model's dtype, every
nn.Linear switches, the weights (and their tying) stay, and the model computes what torch's
default kernel computes; where it does not (a CPU without AVX-512 has no bf16 inner product,
or ATTNSTORE_ONEDNN_UNAVAILABLE=1 says so on any machine), torch's kernel stays and the
kernel report says why. Both paths run on every machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from inference_worker.cpu_linear import (
    UNAVAILABLE_VARIABLE,
    FusedProjection,
    OneDnnLinear,
    _onednn_unavailable,
    linear_plus,
)
from inference_worker.model_card import kernels_message
from inference_worker.model_store import load_model

# Each case runs with the probe's own verdict for this CPU, and with oneDNN forced unavailable.
PROBE = ["detected", "forced-unavailable"]


@pytest.fixture(params=PROBE)
def probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "forced-unavailable":
        monkeypatch.setenv(UNAVAILABLE_VARIABLE, "1")
    else:
        monkeypatch.delenv(UNAVAILABLE_VARIABLE, raising=False)
    return str(request.param)


def _linears(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def _expected_linear(dtype: torch.dtype) -> type[nn.Linear]:
    return nn.Linear if _onednn_unavailable(dtype) is not None else OneDnnLinear


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_chosen_kernel_gives_the_logits_and_tokens_of_torchs_kernel(
    tiny_model_dir: Callable[..., Path], family: str, probe: str
) -> None:
    model_dir = tiny_model_dir(family)
    chosen = load_model(model_dir, torch.float32, "cpu", cpu_linear="onednn")
    default = load_model(model_dir, torch.float32, "cpu", cpu_linear="torch").model
    linear_type = _expected_linear(torch.float32)
    assert {type(m) for m in _linears(chosen.model)} == {linear_type}
    assert {type(m) for m in _linears(default)} == {nn.Linear}
    assert chosen.kernels.linear.kernel == ("onednn" if linear_type is OneDnnLinear else "torch")
    if probe == "forced-unavailable":
        assert linear_type is nn.Linear and UNAVAILABLE_VARIABLE in chosen.kernels.linear.reason

    ids = torch.randint(0, default.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, expected = chosen.model(input_ids=ids).logits, default(input_ids=ids).logits  # [1, 40, vocab]
        tokens = chosen.model.generate(ids, max_new_tokens=16, do_sample=False)[0, 40:]
        expected_tokens = default.generate(ids, max_new_tokens=16, do_sample=False)[0, 40:]
    assert (got - expected).abs().max().item() <= 1e-4
    assert tokens.tolist() == expected_tokens.tolist()


def test_tied_weights_stay_tied_and_bf16_runs(tiny_model_dir: Callable[..., Path], probe: str) -> None:
    loaded = load_model(tiny_model_dir(tie_word_embeddings=True), torch.bfloat16, "cpu")
    model = loaded.model
    # oneDNN's bf16 inner product needs AVX-512 (avx512_bf16 or avx512f emulation): the probe
    # decides per CPU, and the model keeps torch's kernel where it fails.
    assert type(model.lm_head) is _expected_linear(torch.bfloat16)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits  # [1, 3, vocab]
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_the_kernel_report_names_the_cpu_and_every_choice(tiny_model_dir: Callable[..., Path]) -> None:
    kernels = load_model(tiny_model_dir(), torch.float32, "cpu", cpu_linear="torch").kernels
    assert kernels.device == "cpu" and kernels.cpu_capability  # e.g. AVX512, AVX2, DEFAULT
    assert kernels.linear.kernel == "torch" and "ATTNSTORE_WORKER_CPU_LINEAR" in kernels.linear.reason
    assert kernels.attention.kernel.startswith("sdpa") and kernels.attention.reason
    message = kernels_message(kernels)
    assert message.linear.kernel == "torch" and message.cpu_capability == kernels.cpu_capability


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: q, k, v with biases
def test_fused_projections_give_bitwise_each_layers_output(
    tiny_model_dir: Callable[..., Path], family: str
) -> None:
    model = load_model(tiny_model_dir(family), torch.float32, "cpu", cpu_linear="onednn").model
    if _onednn_unavailable(torch.float32) is not None:
        pytest.skip("oneDNN's fp32 inner product is unavailable on this CPU: no fused projections")
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert isinstance(attn.fused_qkv, FusedProjection) and isinstance(mlp.fused_gate_up, FusedProjection)
    assert family != "qwen2" or attn.fused_qkv.bias is not None
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for rows in (1, 2, 7, 64):  # one row: the layers' own matrix-vector kernel
            x = torch.randn(rows, model.config.hidden_size, generator=generator)
            for fused, linears in ((attn.fused_qkv, (attn.q_proj, attn.k_proj, attn.v_proj)),
                                   (mlp.fused_gate_up, (mlp.gate_proj, mlp.up_proj))):  # fmt: skip
                for got, linear in zip(fused(x), linears, strict=True):
                    assert torch.equal(got, linear(x))
                    assert (got - nn.functional.linear(x, linear.weight, linear.bias)).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_weights_are_the_layers_weights_not_a_copy(
    tiny_model_dir: Callable[..., Path], family: str
) -> None:
    """The one-row kernel reads one concatenation that the layers' weights are views of; a
    second fusion over consecutive layers (the restore's k, v) shares it too."""
    model = load_model(tiny_model_dir(family), torch.float32, "cpu", cpu_linear="onednn").model
    if _onednn_unavailable(torch.float32) is not None:
        pytest.skip("oneDNN's fp32 inner product is unavailable on this CPU: no fused projections")
    attn = model.model.layers[0].self_attn
    plain = attn.fused_qkv.plain
    offset = 0
    for linear in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert linear.weight.untyped_storage().data_ptr() == plain.untyped_storage().data_ptr()
        assert torch.equal(linear.weight, plain[offset : offset + linear.out_features])
        offset += linear.out_features
    kv = FusedProjection((attn.k_proj, attn.v_proj))
    assert kv.plain.data_ptr() == attn.k_proj.weight.data_ptr()
    assert torch.equal(kv.plain, torch.cat([attn.k_proj.weight, attn.v_proj.weight]))
    x = torch.randn(1, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert all(
            torch.equal(got, linear(x)) for got, linear in zip(kv(x), (attn.k_proj, attn.v_proj), strict=True)
        )


@pytest.mark.parametrize("rows", [1, 2, 9])  # one row: the plain weight's kernel; more: the packed one
def test_linear_plus_is_bitwise_the_separate_add(
    tiny_model_dir: Callable[..., Path], rows: int, probe: str
) -> None:
    """The residual add as oneDNN's post-op gives bitwise the projection plus the residual;
    where oneDNN is unavailable the layer stays nn.Linear and the add is torch's."""
    model = load_model(tiny_model_dir("qwen2"), torch.float32, "cpu").model  # q_proj has a bias
    generator = torch.Generator().manual_seed(4)
    for linear in (model.model.layers[0].self_attn.q_proj, model.model.layers[0].mlp.down_proj):
        assert type(linear) is _expected_linear(torch.float32)
        x = torch.randn(rows, linear.in_features, generator=generator)
        residual = torch.randn(rows, linear.out_features, generator=generator)
        with torch.no_grad():
            assert torch.equal(linear_plus(linear, x, residual), residual + linear(x))
