"""Decode attention over block tables in torch ops, every decode row of a layer in one batch:
the decode kernel's contract (decode_kernel.py) on devices the C kernel does not run on (CUDA).

Why: without it a CUDA decode step attended each sequence in its own SDPA call over its
gathered blocks, 30 layers x 16 sequences = 480 calls a step, each ~190 us of host time on
an H200 (fp32 with grouped heads takes SDPA's math path: several kernels a call), 8.0 of a
16-session run's 14.9 s (docs/inference-worker.md, "On a GPU"). Here a layer is a fixed
handful of kernels whatever the batch: one gather of all tables' blocks, padded to the
longest table, two batched matmuls and a masked softmax, in fp32. On a CPU the C kernel
reads the blocks in place instead; padding there cost more than the calls (attention.py).
"""

from __future__ import annotations

import torch

from inference_worker.engine.decode_kernel import DecodeAttention, DecodeCall


class BatchedDecode(DecodeAttention):
    what = "the batched decode attention"

    @staticmethod
    def supports(dtype: torch.dtype, device: torch.device) -> bool:
        return device.type != "cpu" and dtype in (torch.float32, torch.bfloat16, torch.float16)

    def _attend(self, call: DecodeCall) -> None:
        q, k, v, out, rows, tables, lens, scale, window, lse = call
        sequences, heads, dim = rows.shape[0], q.shape[1], q.shape[2]
        kv_heads, _, block_tokens, _ = k.shape
        if heads % kv_heads:
            raise RuntimeError(
                f"batched decode attention: unsupported heads ({heads} over {kv_heads} KV heads)"
            )
        context = tables.shape[1] * block_tokens
        blocks = tables.long()
        # [kv_heads, sequences, max_blocks, B, D] -> [sequences, kv_heads, context, D]
        keys = k[:, blocks].reshape(kv_heads, sequences, context, dim).transpose(0, 1).float()
        values = v[:, blocks].reshape(kv_heads, sequences, context, dim).transpose(0, 1).float()
        query = q[rows].reshape(sequences, kv_heads, heads // kv_heads, dim).float()
        # [sequences, kv_heads, group, context]
        scores = torch.matmul(query, keys.transpose(-1, -2)).mul_(scale)
        position = torch.arange(context, device=q.device)[None, :]
        lengths = lens.long()[:, None]
        visible = position < lengths  # [sequences, context]
        if window is not None:
            visible &= position >= lengths - window
        scores.masked_fill_(~visible[:, None, None, :], float("-inf"))
        if lse is not None:
            lse.copy_(torch.logsumexp(scores, dim=-1).reshape(sequences, heads))
        attended = torch.matmul(torch.softmax(scores, dim=-1), values)  # [sequences, kv_heads, group, D]
        out[rows] = attended.reshape(sequences, heads, dim).to(out.dtype)
