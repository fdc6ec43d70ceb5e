"""An output whose rows lie in several buffers: runs of consecutive rows of the whole, each at its
place. The chunked delta rule's calls (prefill_groups.py) each return a new buffer, in the calls'
row order; a step's rows are in request order, so before this the mixer copied every call's output
run by run into one tensor (~4.6 ms of the 122B's 2 x 8K prefill step on an H200, a [T, 8192] bf16
round trip a GDN layer). A row-wise reader (GDN's output norm, layers/norm.py) reads the runs where
they are instead, and writes its own output in step order; a reader that needs one tensor
assembles it."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowPieces:
    runs: tuple[tuple[torch.Tensor, int], ...]  # (rows [n, ...], their first row in the whole)
    num_rows: int

    def __post_init__(self) -> None:
        covered = sorted((start, start + rows.shape[0]) for rows, start in self.runs)
        if [a for a, _ in covered] != [0] + [b for _, b in covered[:-1]] or covered[-1][1] != self.num_rows:
            raise ValueError(f"row runs {covered} do not tile rows [0, {self.num_rows}) once each")

    @property
    def first(self) -> torch.Tensor:
        return self.runs[0][0]

    def assemble(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The whole [num_rows, ...] as one tensor (into `out` when given)."""
        if out is None:
            out = self.first.new_empty((self.num_rows, *self.first.shape[1:]))
        for rows, start in self.runs:
            out[start : start + rows.shape[0]] = rows
        return out


def assembled(x: torch.Tensor | RowPieces) -> torch.Tensor:
    return x.assemble() if isinstance(x, RowPieces) else x
