"""A request's lifecycle state as the scheduler tracks it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import TokenLogprob
from minisgl.scheduler.stop import StopChecker


@dataclass(eq=False)  # identity equality: two requests with equal fields are still two requests
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    stop_checker: StopChecker | None = None
    chat_turn: bool = False  # GenerateRequest.chat_turn
    prefix_keys: list[tuple[int, int]] = field(default_factory=list)  # the cache's keys of its prompt (lpm)
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    num_computed: int = 0  # tokens fed to the model: their KV/state is written (or queued on the device)
    num_cached: int = 0  # prompt tokens a cached prefix gave it at admission (computed for an earlier request)
    checkpoints: tuple[int, ...] = ()  # prompt lengths to cache the prefix (and state) of, ascending
    num_pending: int = 0  # tokens sampled on the device that the CPU has not seen yet (overlap loop)
    pending_row: int = -1  # row of the newest pending token in the in-flight step's sampled tokens
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    num_reported: int = 0  # output tokens already returned by step()
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] | None = None  # filled chunk by chunk during prefill
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has nothing before it to predict it

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_sampled(self) -> int:
        return len(self.output_ids) + self.num_pending
