"""layers/row_pieces.py: runs of rows that must tile the whole once, assembled in place."""
from __future__ import annotations

import pytest
import torch

from minisgl.layers.row_pieces import RowPieces, assembled


def test_runs_assemble_in_their_places() -> None:
    whole = torch.randn(9, 2, 3)
    pieces = RowPieces(((whole[5:].clone(), 5), (whole[:2].clone(), 0), (whole[2:5].clone(), 2)), 9)
    assert torch.equal(pieces.assemble(), whole)
    out = torch.full_like(whole, float("nan"))
    assert pieces.assemble(out) is out and torch.equal(out, whole)
    assert assembled(whole) is whole and torch.equal(assembled(pieces), whole)


@pytest.mark.parametrize("runs", [((0, 4), (3, 9)), ((0, 4), (5, 9)), ((0, 4), (4, 8)), ((1, 9),)])
def test_runs_that_overlap_or_leave_gaps_are_refused(runs: tuple[tuple[int, int], ...]) -> None:
    with pytest.raises(ValueError, match="do not tile"):
        RowPieces(tuple((torch.zeros(b - a, 2), a) for a, b in runs), 9)
