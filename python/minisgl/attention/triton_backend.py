"""Paged attention on our Triton kernels: split-KV decode when every request adds one token,
the varlen extend kernel (cached prefix + new tokens, causal) otherwise."""
from __future__ import annotations

import torch

from minisgl.forward_batch import ForwardBatch
from minisgl.kernels.paged_attention import paged_decode, paged_extend


class TritonAttentionBackend:
    cuda_graph_safe = True  # decode reads only device tensors (seq_lens, table rows)

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_pages * page_size, Hkv, D]
        v_cache: torch.Tensor,
        batch: ForwardBatch,
        page_table: torch.Tensor,
        page_size: int,
        scale: float,
    ) -> torch.Tensor:
        # New K/V go into the cache first: the kernels read every key, cached or new, from there.
        k_cache[batch.cache_loc] = k.to(k_cache.dtype)
        v_cache[batch.cache_loc] = v.to(v_cache.dtype)
        if batch.is_decode:
            return paged_decode(q, k_cache, v_cache, page_table, batch.table_rows, batch.seq_lens, page_size, scale)
        return paged_extend(
            q, k_cache, v_cache, page_table, batch.table_rows, batch.seq_lens, batch.cu_seqlens,
            max(batch.extend_lens), page_size, scale,
        )
