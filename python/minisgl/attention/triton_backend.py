"""Paged attention on our Triton kernels: split-KV decode when every request adds one token,
the varlen extend kernel (cached prefix + new tokens, causal) otherwise."""
from __future__ import annotations

import torch

from minisgl.attention.paged_kv import PagedKV
from minisgl.forward_batch import ForwardBatch
from minisgl.kernels.paged_attention import paged_decode, paged_extend


class TritonAttentionBackend:
    cuda_graph_safe = True  # decode reads only device tensors (seq_lens, table rows)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKV, batch: ForwardBatch, scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # New K/V go into the cache first: the kernels read every key, cached or new, from there.
        kv.store(batch.cache_loc, k, v)
        if batch.is_decode:
            return paged_decode(
                q, kv.k_cache, kv.v_cache, kv.page_table, batch.table_rows, batch.seq_lens, kv.page_size, scale,
                out=out,
            )
        # A mixed step's leading decodes take the split-KV decode kernel; the extend kernel's grid
        # covers only the prefill requests (its blocks are sized by the longest of them).
        d, part = batch.leading_decodes, batch.prefill_requests
        out = torch.empty_like(q) if out is None else out
        if d:
            paged_decode(q[:d], kv.k_cache, kv.v_cache, kv.page_table, batch.table_rows[:d], batch.seq_lens[:d],
                         kv.page_size, scale, out=out[:d])
        paged_extend(
            q[d:], kv.k_cache, kv.v_cache, kv.page_table, part.table_rows, part.seq_lens, part.cu_seqlens,
            max(part.extend_lens), kv.page_size, scale, out=out[d:],
        )
        return out
