"""A [rows, channels] output stored as contiguous column blocks: GDN's conv writes q, k and v this
way, so each is a contiguous [rows, width] tensor that the delta rule's kernels (fla's copy any
strided input first) read as they are.

Block i covers channels [start_i, end_i) with bounds (b1, b2): [0, b1), [b1, b2), [b2, channels).
Element (r, c) of block i lives at flat[start_i * rows + r * (end_i - start_i) + (c - start_i)].
A writer covers rows [row0, row0 + n) of the whole (a mixed step's decodes, then its prefill).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class PlanarOut:
    flat: torch.Tensor  # [rows * channels]
    rows: int
    channels: int
    bounds: tuple[int, int]
    row0: int = 0  # the first row this writer covers

    @staticmethod
    def empty(rows: int, channels: int, bounds: tuple[int, int], dtype: torch.dtype,
              device: torch.device) -> "PlanarOut":
        b1, b2 = bounds
        if not 0 <= b1 <= b2 <= channels:
            raise ValueError(f"column bounds {bounds} must satisfy 0 <= b1 <= b2 <= {channels}")
        return PlanarOut(torch.empty(rows * channels, dtype=dtype, device=device), rows, channels, bounds)

    def from_row(self, row0: int) -> "PlanarOut":
        """The writer of rows [row0, rows)."""
        return replace(self, row0=row0)

    def parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The three blocks as contiguous [rows, width] tensors (all rows, whatever row0 is)."""
        b1, b2 = self.bounds
        out, start = [], 0
        for end in (b1, b2, self.channels):
            out.append(self.flat[start * self.rows : end * self.rows].view(self.rows, end - start))
            start = end
        return out[0], out[1], out[2]

    def write(self, values: torch.Tensor) -> None:
        """Rows [row0, row0 + len(values)) from a plain [n, channels] tensor (the torch backend's way)."""
        b1, b2 = self.bounds
        n = values.shape[0]
        for part, (s, e) in zip(self.parts(), ((0, b1), (b1, b2), (b2, self.channels))):
            part[self.row0 : self.row0 + n] = values[:, s:e]
