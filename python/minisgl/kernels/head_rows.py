"""Launch arithmetic shared by the kernels that walk a [T, heads, head_dim] tensor one (token, head)
row at a time (kernels/qk_norm_rope.py, kernels/sigmoid_gate.py): the contiguous output and the
tile of rows each program covers."""
from __future__ import annotations

import torch
import triton


def head_rows_output(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A new contiguous tensor shaped and typed as x [T, heads, head_dim], or `out` checked to be one."""
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}")
    return out


def head_row_tiles(rows: int, head_dim: int, tile: int) -> tuple[int, int, int]:
    """(programs, BLOCK_R, BLOCK_C): BLOCK_R whole rows padded to BLOCK_C, about `tile` elements a program."""
    block_c = triton.next_power_of_2(head_dim)
    block_r = max(1, tile // block_c)
    return triton.cdiv(rows, block_r), block_r, block_c
