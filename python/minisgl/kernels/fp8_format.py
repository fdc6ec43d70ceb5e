"""The FP8 format the checkpoints and the kernels share: e4m3 codes and their largest finite value.
Only torch here, so the CPU paths (layers/fp8.py) read it without triton."""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
GROUP = 128  # activation groups are 1 x GROUP of a token's features; weight blocks GROUP x GROUP


def rows_split_into_groups(shape: torch.Size | tuple[int, ...]) -> bool:
    """Whether the rows of a [T, ..., C] tensor (a token's features being its rows flattened) hold
    whole groups: C a multiple of 128."""
    return len(shape) >= 2 and shape[-1] % GROUP == 0
