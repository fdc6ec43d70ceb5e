"""Host lists to device tensors without making the host wait for the device."""
from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """On CUDA a copy from pageable memory waits for all work queued before it, which would stall
    the step being planned behind the one running; from pinned memory it is asynchronous (the
    caching host allocator keeps the buffer until the copy is done)."""
    t = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t
