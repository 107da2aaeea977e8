"""Capturing each layer's input hidden states in the paged forward, for the sequences whose
chunks a storage plan keeps as hidden states (PagedModelRunner.layer_input_hook).

Only watched sequences pay: the hook copies their rows of each layer's input, step by
step (prefill chunks, then one row per decode), and `take` joins them per layer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from inference_worker.engine.model_runner import Batch, PagedModelRunner
from inference_worker.engine.sequence import Sequence


class HiddenCapture:
    """Installs itself as `runner.layer_input_hook`; watch a sequence before it runs."""

    def __init__(self, runner: PagedModelRunner) -> None:
        self.num_layers = runner.geometry.num_layers
        # sequence (by identity: it is watched before an engine numbers it) -> layer -> (start, rows)
        self._rows: dict[Sequence, list[list[tuple[int, torch.Tensor]]]] = {}
        self._lock = threading.Lock()  # the hook runs in the engine thread
        runner.layer_input_hook = self

    def watch(self, seq: Sequence) -> None:
        with self._lock:
            self._rows[seq] = [[] for _ in range(self.num_layers)]

    def take(self, seq: Sequence) -> tuple[int, list[torch.Tensor]]:
        """The first position `seq` computed while watched and, per layer, the input hidden
        states [tokens, hidden] of the tokens from there; stops watching it. A token computed
        twice (recomputed after a failed load or a preemption) keeps its last rows."""
        with self._lock:
            layers = self._rows.pop(seq)
        return _first(layers), [_placed(pieces, _first(layers)) for pieces in layers]

    def peek(self, seq: Sequence) -> tuple[int, list[torch.Tensor]]:
        """What `take` would return, still watching `seq` (a preempted sequence's snapshot)."""
        with self._lock:
            layers = [list(pieces) for pieces in self._rows[seq]]
        return _first(layers), [_placed(pieces, _first(layers)) for pieces in layers]

    def seed(self, seq: Sequence, start: int, layers: Mapping[int, torch.Tensor]) -> None:
        """Adds rows [tokens, hidden] of some layers from position `start` that `seq` did not
        compute (a restored partial chunk's), if it is watched."""
        with self._lock:
            watched = self._rows.get(seq)
            if watched is not None:
                for layer, rows in layers.items():
                    watched[layer].append((start, rows))

    def forget(self, seq: Sequence) -> None:
        """Stops watching `seq` if it still is, dropping what it captured."""
        with self._lock:
            self._rows.pop(seq, None)

    def __call__(self, layer: int, hidden: torch.Tensor, batch: Batch) -> None:
        with self._lock:
            if not self._rows:
                return
            for seq, part in zip(batch.seqs, batch.slices, strict=True):
                watched = self._rows.get(seq)
                if watched is not None:
                    watched[layer].append((part.start, hidden[part.rows].clone()))  # [new, hidden]


def _first(layers: list[list[tuple[int, torch.Tensor]]]) -> int:
    return min((start for pieces in layers for start, _ in pieces), default=0)


def _placed(pieces: list[tuple[int, torch.Tensor]], first: int) -> torch.Tensor:
    """The pieces' rows at their positions from `first` (later pieces overwrite earlier ones;
    zeros before a layer's first piece: only seeded layers start earlier, and the others'
    rows there are never stored)."""
    if not pieces:
        return torch.empty(0)
    stop = max(start + len(rows) for start, rows in pieces)
    out = pieces[0][1].new_zeros((stop - first, pieces[0][1].shape[1]))
    for start, rows in pieces:
        out[start - first : start - first + len(rows)] = rows
    return out
