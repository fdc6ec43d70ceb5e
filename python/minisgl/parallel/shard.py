"""Which part of a full checkpoint tensor one rank holds, so the loader reads only those bytes.

A Shard names the full tensor's shape and, along some of its dims, the [start, end) ranges whose
concatenation (in order) is the rank's tensor; other dims are whole. Several ranges along one dim
describe fused tensors: a GDN rank's in_proj_qkv rows are its q, k and v heads, three ranges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Range = tuple[int, int]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Shard:
    full_shape: tuple[int, ...]
    cuts: tuple[tuple[int, tuple[Range, ...]], ...]  # (dim, ranges), each dim at most once

    def __post_init__(self) -> None:
        dims = [d for d, _ in self.cuts]
        if len(set(dims)) != len(dims):
            raise ValueError(f"a shard cuts each dim once, got dims {dims}")
        for dim, ranges in self.cuts:
            if not 0 <= dim < len(self.full_shape) or not ranges:
                raise ValueError(f"bad cut along dim {dim} of a tensor of shape {self.full_shape}")
            for s, e in ranges:
                if not 0 <= s < e <= self.full_shape[dim]:
                    raise ValueError(f"range [{s}, {e}) out of bounds for dim {dim} of shape {self.full_shape}")

    @staticmethod
    def along(full_shape: tuple[int, ...], dim: int, *ranges: Range) -> "Shard":
        return Shard(tuple(full_shape), ((dim, tuple(ranges)),))

    def also(self, dim: int, *ranges: Range) -> "Shard":
        """This shard cut along one more dim."""
        return Shard(self.full_shape, (*self.cuts, (dim, tuple(ranges))))

    @property
    def shape(self) -> tuple[int, ...]:
        """The rank's tensor shape."""
        shape = list(self.full_shape)
        for dim, ranges in self.cuts:
            shape[dim] = sum(e - s for s, e in ranges)
        return tuple(shape)

    def read(self, source: Any) -> torch.Tensor:
        """The rank's part of `source` (a tensor, or a safetensors slice that reads only what it is
        indexed with), concatenating the ranges of each cut dim in order."""

        def part(cut: int, index: list[slice]) -> torch.Tensor:
            if cut == len(self.cuts):
                return source[tuple(index)]
            dim, ranges = self.cuts[cut]
            pieces = []
            for s, e in ranges:
                index[dim] = slice(s, e)
                pieces.append(part(cut + 1, index))
            index[dim] = slice(None)
            return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)

        return part(0, [slice(None)] * len(self.full_shape))

    def block_scales(self, block: tuple[int, int]) -> "Shard":
        """The shard of the tensor's FP8 block scales ([..., ceil(rows/b0), ceil(cols/b1)]). Every cut
        of the last two dims must fall on a block boundary (a partial edge block only at the very
        end), or a rank's blocks would mix its rows with another rank's; ValueError otherwise."""
        nd = len(self.full_shape)
        blocks = {nd - 2: block[0], nd - 1: block[1]}
        full = list(self.full_shape)
        for dim, b in blocks.items():
            full[dim] = _cdiv(self.full_shape[dim], b)
        cuts = []
        for dim, ranges in self.cuts:
            b = blocks.get(dim)
            if b is None:
                cuts.append((dim, ranges))
                continue
            for i, (s, e) in enumerate(ranges):
                at_end = e == self.full_shape[dim] and i == len(ranges) - 1
                if s % b or (e % b and not at_end):
                    raise ValueError(
                        f"range [{s}, {e}) of dim {dim} (size {self.full_shape[dim]}) cuts a {b}-wide FP8 block"
                    )
            cuts.append((dim, tuple((s // b, _cdiv(e, b)) for s, e in ranges)))
        return Shard(tuple(full), tuple(cuts))
