"""Which form each layer of a namespace's chunks is stored in, decided at save time.

    layers  [0, recompute)                   NONE    nothing stored: rebuilt by recomputation
            [recompute, recompute + hidden)  HIDDEN  input hidden states (K, V by projection)
            [recompute + hidden, L)          KV      K and V, loaded as they are

Recomputation must come first: layer r's input is the output of layers 0..r-1. Hidden
layers come before the KV layers so their projections (compute) run while the KV layers
are still being read (IO), and the restore ends with a read, not a projection.

A plan whose hidden states are not smaller than K and V (grouped-query models: SmolLM2
stores 576 hidden values per token per layer against 384 of K and V) is refused: it
would cost more bytes and more time than KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnstore.chunks.format import LayerForm
from inference_worker.model_geometry import ModelGeometry


class HiddenStatesNotSmaller(ValueError):
    """The model's hidden states are at least as large as its K and V: keep KV."""


def hidden_pays_off(geometry: ModelGeometry, hidden_size: int) -> bool:
    """Hidden states take fewer bytes than K and V (multi-head attention: half)."""
    return hidden_size < 2 * geometry.kv_heads * geometry.head_dim


@dataclass(frozen=True)
class StoragePlan:
    num_layers: int
    recompute_layers: int = 0
    hidden_layers: int = 0

    def __post_init__(self) -> None:
        if (
            min(self.recompute_layers, self.hidden_layers) < 0
            or self.recompute_layers + self.hidden_layers > self.num_layers
        ):
            raise ValueError(f"storage plan {self.name} does not fit {self.num_layers} layers")

    @classmethod
    def all_kv(cls, num_layers: int) -> StoragePlan:
        return cls(num_layers)

    @property
    def kv_layers(self) -> int:
        return self.num_layers - self.recompute_layers - self.hidden_layers

    @property
    def is_kv(self) -> bool:
        """Every layer KV: the classic chunk format and namespace."""
        return self.kv_layers == self.num_layers

    @property
    def forms(self) -> tuple[LayerForm, ...]:
        return (
            (LayerForm.NONE,) * self.recompute_layers
            + (LayerForm.HIDDEN,) * self.hidden_layers
            + (LayerForm.KV,) * self.kv_layers
        )

    @property
    def name(self) -> str:
        """e.g. "r2h10k12": part of the namespace (chunks of two plans never mix)."""
        return f"r{self.recompute_layers}h{self.hidden_layers}k{self.kv_layers}"

    @property
    def namespace_tag(self) -> str:
        """NamespaceSpec.storage_plan: "" for all-KV (the classic KV namespace and chunks)."""
        return "" if self.is_kv else self.name

    def bytes_per_token(self, geometry: ModelGeometry, hidden_size: int, element_bytes: int) -> int:
        """Stored bytes of one token, every layer."""
        kv = 2 * geometry.kv_heads * geometry.head_dim
        return (self.hidden_layers * hidden_size + self.kv_layers * kv) * element_bytes

    def check(self, geometry: ModelGeometry, hidden_size: int) -> None:
        """Raises HiddenStatesNotSmaller for hidden layers on a model where they do not pay."""
        if self.hidden_layers and not hidden_pays_off(geometry, hidden_size):
            raise HiddenStatesNotSmaller(
                f"hidden states ({hidden_size} values per token per layer) are not smaller than "
                f"K and V ({2 * geometry.kv_heads * geometry.head_dim}): store KV"
            )
