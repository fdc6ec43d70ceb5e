"""torch dtypes as Triton's, for kernels that take a rounding dtype as a constexpr."""
from __future__ import annotations

import torch
import triton.language as tl

TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
