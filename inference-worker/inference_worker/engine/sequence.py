"""One sequence as the engine sees it: its tokens, the pool blocks that hold their KV, and
how many of those tokens' KV is already computed (or loaded).

    tokens:   t0 t1 t2 ... t(computed-1) | t(computed) ... t(n-1)
              KV in the pool's blocks     | still to run (prefill chunk or the decode token)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

from attnstore.chunks.keys import NAMESPACE_BYTES

_ids = itertools.count()


@dataclass(eq=False)  # identity: two sequences with equal tokens are still two sequences
class Sequence:
    token_ids: list[int]
    namespace: bytes = bytes(NAMESPACE_BYTES)  # its KV's namespace: who may share its blocks
    seq_id: int = field(default_factory=lambda: next(_ids))
    block_table: list[int] = field(default_factory=list)  # pool block of tokens [iB, (i+1)B)
    computed_tokens: int = 0  # tokens [0, computed_tokens) have their KV in the blocks
    block_keys: list[bytes] = field(default_factory=list)  # chain keys of its first full blocks

    @classmethod
    def of(cls, tokens: Tokens[int], namespace: bytes = bytes(NAMESPACE_BYTES)) -> Sequence:
        return cls(list(tokens), namespace)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def pending_tokens(self) -> int:
        """Tokens whose KV the next forward passes must compute."""
        return len(self.token_ids) - self.computed_tokens
