"""Copies between host and device that do not make the host wait for the device."""
from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[float] | torch.Tensor, dtype: torch.dtype,
              device: torch.device | str) -> torch.Tensor:
    """On CUDA a copy from pageable memory waits for all work queued before it, which would stall
    the step being planned behind the one running; from pinned memory it is asynchronous (the
    caching host allocator keeps the buffer until the copy is done). values: a list or a CPU tensor."""
    t = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def take_rows(t: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """t[rows] along dim 0. Indexing a CUDA tensor with a Python list copies the list to the device
    with a blocking copy, which waits for every queued step; this copies it as to_device does, and
    all rows in order are t itself."""
    if len(rows) == t.shape[0] and all(i == r for i, r in enumerate(rows)):
        return t
    return t[to_device(rows, torch.int64, t.device)]


def to_host_async(t: torch.Tensor) -> torch.Tensor:
    """A device tensor's copy in pinned host memory, queued without waiting; read it only once an
    event recorded after this call is reached. A CPU tensor is returned as it is."""
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)
