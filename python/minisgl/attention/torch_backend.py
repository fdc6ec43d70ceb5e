"""Reference paged causal attention in torch: the CPU path, and what GPU kernels are tested against."""
from __future__ import annotations

import torch

from minisgl.attention.paged_kv import PagedKV
from minisgl.forward_batch import ForwardBatch


class TorchAttentionBackend:
    cuda_graph_safe = False  # walks the requests' lengths on the host

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PagedKV, batch: ForwardBatch, scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q [T, Hq, D], k, v [T, Hkv, D] -> [T, Hq, D] (into `out` when given); the new k, v are stored
        in kv first."""
        kv.store(batch.cache_loc, k, v)
        out = torch.empty_like(q) if out is None else out
        group = q.shape[1] // k.shape[1]
        start = 0
        for i, (prefix, n) in enumerate(zip(batch.prefix_lens, batch.extend_lens)):
            locs = kv.locations(batch.table_rows[i], prefix + n)
            keys = kv.k_cache[locs].float().repeat_interleave(group, dim=1)  # [S, Hq, D]
            vals = kv.v_cache[locs].float().repeat_interleave(group, dim=1)
            qi = q[start : start + n].float()
            scores = torch.einsum("thd,shd->hts", qi, keys) * scale
            # Query t sits at position prefix + t and sees keys at positions <= prefix + t.
            visible = torch.arange(prefix + n, device=q.device)[None, :] <= (
                prefix + torch.arange(n, device=q.device)[:, None]
            )
            scores = scores.masked_fill(~visible, float("-inf"))
            out[start : start + n] = torch.einsum("hts,shd->thd", scores.softmax(-1), vals).to(q.dtype)
            start += n
        return out
