"""The CUDA caching allocator's expandable segments, on by default for an engine that plans its pool.

Without them the allocator carves each step's activations out of fixed segments, and a step whose
mix of tensor sizes finds its free bytes split into blocks too small must reserve new segments: the
memory planner measures a step's peak from an empty cache in reserved bytes for that reason
(engine/device_memory.py, peak_bytes), and on the 122B that peak was 2.72 GiB against 1.74 GiB
allocated, a GiB the pool could not have. Expandable segments map physical pages into one growing
range of addresses instead, so freed blocks merge and reserved follows allocated.

The user's own setting wins: PYTORCH_ALLOC_CONF (or the older PYTORCH_CUDA_ALLOC_CONF) naming
expandable_segments is left as it is. AFD workers keep the default allocator: their exchange
buffers are shared between processes through CUDA IPC handles (afd/ipc_transport.py), which
expandable segments would route through file-descriptor handles that not every container permits.
"""
from __future__ import annotations

import os

import torch

ENV_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
SETTING = "expandable_segments"


def user_chose() -> bool:
    """Whether the environment names the setting, which is then the user's to keep."""
    return any(SETTING in os.environ.get(name, "") for name in ENV_NAMES)


def _set(settings: str) -> None:
    # torch 2.11 and 2.13 have this one (2.13 deprecates the wrapper below); older builds the wrapper only
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = torch.cuda.memory._set_allocator_settings
    setter(settings)


def prefer_expandable_segments() -> bool:
    """Turn expandable segments on for the segments this process reserves from now on, unless the
    user chose; returns whether they are on (as far as the settings say)."""
    if user_chose():
        return any(f"{SETTING}:true" in os.environ.get(name, "").replace(" ", "").lower() for name in ENV_NAMES)
    _set(f"{SETTING}:True")
    return True
