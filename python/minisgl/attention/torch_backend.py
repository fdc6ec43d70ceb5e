"""Reference paged causal attention in torch: the CPU path, and what GPU kernels are tested against."""
from __future__ import annotations

import torch

from minisgl.forward_batch import ForwardBatch


def token_locations(page_table_row: torch.Tensor, length: int, page_size: int) -> torch.Tensor:
    """Flat KV indices of positions [0, length) of the request whose table row is given."""
    pos = torch.arange(length, device=page_table_row.device)
    return page_table_row[pos // page_size].to(torch.int64) * page_size + pos % page_size


class TorchAttentionBackend:
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
        k_cache[batch.cache_loc] = k.to(k_cache.dtype)
        v_cache[batch.cache_loc] = v.to(v_cache.dtype)
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        start = 0
        for i, (prefix, n) in enumerate(zip(batch.prefix_lens, batch.extend_lens)):
            locs = token_locations(page_table[batch.table_rows[i]], prefix + n, page_size)
            keys = k_cache[locs].float().repeat_interleave(group, dim=1)  # [S, Hq, D]
            vals = v_cache[locs].float().repeat_interleave(group, dim=1)
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
