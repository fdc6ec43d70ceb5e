"""take_rows: a gather of rows given as a Python list, without a list index on the device."""
import torch

from minisgl.host_copy import take_rows


def test_all_rows_in_order_are_the_tensor_itself() -> None:
    t = torch.randn(5, 3)
    assert take_rows(t, [0, 1, 2, 3, 4]) is t
    assert take_rows(t, range(5)) is t


def test_other_rows_are_gathered_in_the_given_order() -> None:
    t = torch.randn(5, 3)
    for rows in ([4, 0, 2], [1, 1], [], [0, 1, 2, 4, 3]):
        got = take_rows(t, rows)
        assert got.shape == (len(rows), 3)
        assert torch.equal(got, torch.stack([t[i] for i in rows]) if rows else t[:0])
