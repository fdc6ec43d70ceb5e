"""A request's lifecycle state as the scheduler tracks it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.sampling_params import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0  # tokens whose KV/state is in the pool
    finish_reason: str | None = None
    stop_text: str | None = None  # output text cut before a matched stop string

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < n else self.output_ids[pos - n]
