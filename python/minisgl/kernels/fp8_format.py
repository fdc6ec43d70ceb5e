"""The FP8 format the checkpoints and the kernels share: e4m3 codes and their largest finite value.
Only torch here, so the CPU paths (layers/fp8.py) read it without triton."""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448.0
