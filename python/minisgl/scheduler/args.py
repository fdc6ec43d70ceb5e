"""Scheduler flags that are not engine flags (SGLang's names)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from minisgl.arg_field import arg
from minisgl.prefill_groups import GROUP_TOKENS

SCHEDULE_POLICIES = ("fcfs", "lpm")  # SGLang's names (its other policies are not built)
# Set to 1 to run every step synchronously even where the device is asynchronous.
DISABLE_OVERLAP_ENV = "MINISGL_DISABLE_OVERLAP"


@dataclass(frozen=True)
class SchedulerArgs:
    max_prefill_tokens: int = arg(16384, "max prompt tokens of all requests per step (each request's chunk is at "
                                         f"most --chunked-prefill-size, or in a step without decodes up to {GROUP_TOKENS} "
                                         "tokens where no other prompt can take the budget)")
    schedule_policy: str = arg(
        "fcfs", "which waiting request is admitted next: fcfs (first come, first served) or lpm (the longest prefix "
                "the cache holds first while at most 128 wait: an agent's next call takes its finished call over "
                "before other admissions evict it, at the cost of first come, first served)", SCHEDULE_POLICIES)

    def __post_init__(self) -> None:
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, "
                             f"got {self.schedule_policy!r}")


def overlap_enabled(device: torch.device) -> bool:
    """Overlap only pays where kernels launch asynchronously; on the CPU a step is synchronous anyway."""
    return device.type == "cuda" and os.environ.get(DISABLE_OVERLAP_ENV, "0") in ("", "0")
