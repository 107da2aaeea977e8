"""K and V rebuilt from a layer's input hidden states equal the model's own K and V (fp32,
1e-4), at the positions they were computed at and at shifted ones; recomputing the first
layers gives their K and V and the next layer's input. A random multi-head Llama, the tiny
grouped-query Llama, and the real SmolLM2 weights (GQA: the projection works whatever the
shapes; only storing hidden states does not pay there); each also with its linears on
oneDNN, as the worker runs them, where K and V come from one fused GEMM."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from inference_worker.cpu_linear import OneDnnLinear, use_onednn_linears
from inference_worker.model_store import default_model_dir, load_model
from inference_worker.restore.hidden_states import project_kv, recompute_layers

TOLERANCE = 1e-4


@torch.no_grad()
def reference(model: PreTrainedModel, ids: torch.Tensor, first_position: int):
    """The model's own per-layer K, V [kv_heads, tokens, D] and layer inputs [tokens, hidden]
    of `ids` [tokens] at positions first_position, first_position + 1, ..."""
    cache = DynamicCache()
    positions = torch.arange(first_position, first_position + ids.shape[0], device=ids.device)
    positions = positions[None]  # [1, tokens]
    out = model(
        input_ids=ids[None], position_ids=positions, cache=cache, use_cache=True, output_hidden_states=True
    )
    kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
    inputs = [h[0] for h in out.hidden_states[: model.config.num_hidden_layers]]  # input of layer l
    return kv, inputs


def prompt(tokens: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(1))


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < TOLERANCE


def check_projection(model: PreTrainedModel, tokens: int, first_position: int) -> None:
    ids = prompt(tokens, model.config.vocab_size).to(model.device)
    kv, inputs = reference(model, ids, first_position)
    positions = torch.arange(first_position, first_position + tokens, device=model.device)
    for layer, ((k, v), states) in enumerate(zip(kv, inputs, strict=True)):
        got_k, got_v = project_kv(model, layer, states, positions)
        assert_close(got_k, k)
        assert_close(got_v, v)
    fused = [hasattr(layer.self_attn, "fused_kv") for layer in model.model.layers]
    assert fused == [on_onednn(model)] * len(fused)  # the fused GEMM ran exactly where oneDNN runs


def on_onednn(model: PreTrainedModel) -> bool:
    return isinstance(model.model.layers[0].self_attn.k_proj, OneDnnLinear)


def with_linears(model: PreTrainedModel, linears: str) -> PreTrainedModel:
    """`model` with its linears on oneDNN (`onednn`, as the worker runs them) or torch's."""
    if linears == "onednn":
        assert use_onednn_linears(model, torch.float32).kernel == "onednn"
    return model


@pytest.fixture(params=["mha-torch", "gqa-torch", "mha-onednn", "gqa-onednn"])
def model(request: pytest.FixtureRequest, tiny_llama_factory) -> PreTrainedModel:
    attention, linears = request.param.split("-")
    heads = 4 if attention == "mha" else 2
    return with_linears(tiny_llama_factory(num_key_value_heads=heads), linears)


@pytest.mark.parametrize("first_position", [0, 37], ids=["original", "shifted"])
def test_projected_kv_equals_the_models(model: PreTrainedModel, first_position: int) -> None:
    check_projection(model, 40, first_position)


def test_projection_at_other_positions_rotates_keys_only(model: PreTrainedModel) -> None:
    """The same hidden states projected at two positions: V equal, K differ (RoPE moved)."""
    ids = prompt(12, model.config.vocab_size)
    _, inputs = reference(model, ids, 0)
    k0, v0 = project_kv(model, 1, inputs[1], torch.arange(12))
    k5, v5 = project_kv(model, 1, inputs[1], torch.arange(5, 17))
    assert torch.equal(v0, v5)
    assert (k0 - k5).abs().max().item() > 1e-2


@pytest.mark.parametrize("count", [1, 2, 3])
def test_recomputed_first_layers_give_their_kv_and_the_next_input(model: PreTrainedModel, count: int) -> None:
    ids = prompt(33, model.config.vocab_size)
    kv, inputs = reference(model, ids, 0)
    got, hidden = recompute_layers(model, ids, torch.arange(33), count)
    assert len(got) == count
    for (k, v), (want_k, want_v) in zip(got, kv, strict=False):
        assert_close(k, want_k)
        assert_close(v, want_v)
    if count < model.config.num_hidden_layers:
        assert_close(hidden, inputs[count])


@pytest.mark.gpu
@pytest.mark.parametrize("first_position", [0, 37], ids=["original", "shifted"])
def test_projected_and_recomputed_kv_on_cuda(tiny_llama_factory, first_position: int) -> None:
    """The CUDA path: projections and the recomputed first layers on the GPU equal the
    model's own forward there."""
    model = tiny_llama_factory(num_key_value_heads=4).to("cuda")
    check_projection(model, 40, first_position)
    ids = prompt(33, model.config.vocab_size).to("cuda")
    kv, inputs = reference(model, ids, 0)
    got, hidden = recompute_layers(model, ids, torch.arange(33, device="cuda"), 2)
    for (k, v), (want_k, want_v) in zip(got, kv, strict=False):
        assert_close(k, want_k)
        assert_close(v, want_v)
    assert_close(hidden, inputs[2])


@pytest.mark.parametrize("linears", ["torch", "onednn"])
def test_biased_projections(tiny_qwen2_factory, linears: str) -> None:
    """Qwen2's k and v have biases: the fused GEMM adds them as the linears do."""
    model = with_linears(tiny_qwen2_factory(num_key_value_heads=4), linears)
    check_projection(model, 40, 0)
    check_projection(model, 40, 37)


@pytest.mark.parametrize("linears", ["torch", "onednn"])
def test_real_smollm2_weights(linears: str) -> None:
    model = load_model(default_model_dir(), torch.float32, "cpu", cpu_linear=linears).model
    assert on_onednn(model) == (linears == "onednn")
    check_projection(model, 24, 0)
    check_projection(model, 24, 100)
