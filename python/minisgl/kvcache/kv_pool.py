"""Paged K/V storage for the full-attention layers only (GDN layers keep no per-token cache)."""
from __future__ import annotations

import torch


class KVPool:
    """K and V as [num_full_layers, num_pages * page_size, kv_heads, head_dim].

    A token at position p of a request lives at flat index table[row, p // page_size] * page_size + p % page_size.
    """

    def __init__(
        self,
        layer_ids: tuple[int, ...],
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self._index = {layer: i for i, layer in enumerate(layer_ids)}
        shape = (len(layer_ids), num_pages * page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._index[layer_id]
        return self.k[i], self.v[i]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
