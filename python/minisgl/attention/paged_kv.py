"""One full-attention layer's paged K/V cache, as the attention backends read and write it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.kernels.fp8_format import FP8_DTYPE, FP8_MAX


def cache_values(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as the cache stores it: cast, and for FP8 (a scale of 1) saturated at +-448 first, since
    torch's cast turns what lies beyond into NaN."""
    if dtype == FP8_DTYPE:
        x = x.clamp(-FP8_MAX, FP8_MAX)
    return x.to(dtype)


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """FP8 tensors as their bytes for indexed writes, which CUDA's index_put does not take in
    every float8 build; other dtypes as they are."""
    return t.view(torch.uint8) if t.dtype == FP8_DTYPE else t


@dataclass(frozen=True)
class PagedKV:
    """Position p of the request on page-table row r lives at flat index
    page_table[r, p // page_size] * page_size + p % page_size of both caches."""

    k_cache: torch.Tensor  # [num_pages * page_size, Hkv, D]
    v_cache: torch.Tensor
    page_table: torch.Tensor  # [rows, pages per request] int32
    page_size: int

    def store(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' k, v [T, Hkv, D] at flat indices loc [T]."""
        _bytes_view(self.k_cache)[loc] = _bytes_view(cache_values(k, self.k_cache.dtype))
        _bytes_view(self.v_cache)[loc] = _bytes_view(cache_values(v, self.v_cache.dtype))

    def locations(self, row: int | torch.Tensor, length: int) -> torch.Tensor:
        """Flat indices of positions [0, length) of the request on table row `row`."""
        pos = torch.arange(length, device=self.page_table.device)
        return self.page_table[row][pos // self.page_size].to(torch.int64) * self.page_size + pos % self.page_size
