"""Sampling a step without making the host wait for the device, the same way in the colocated
scheduler and on an AFD attention worker: sample on the device, queue the tokens' copy to pinned
host memory, record an event after it; whoever retires the step waits on that event only then.
Also the one rule for which random generator a request samples with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from minisgl.engine.sampler import Sampler
from minisgl.host_copy import to_host_async
from minisgl.sampling_params import SamplingParams


def request_generator(params: SamplingParams, shared: torch.Generator) -> torch.Generator | None:
    """None for greedy requests; a request with a seed gets its own generator, so its tokens do not
    depend on what else runs beside it; the others share `shared`."""
    if params.greedy:
        return None
    if params.seed is not None:
        return torch.Generator(device=shared.device).manual_seed(params.seed)
    return shared


@dataclass(frozen=True)
class AsyncSample:
    tokens: torch.Tensor  # [R] int64 on the device: what the next step's decodes embed
    host_tokens: torch.Tensor  # [R] its host copy, complete once `done` has been reached
    done: torch.cuda.Event | None  # recorded after the copies (None on the CPU, where they are synchronous)

    def wait(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()
        return self.host_tokens.tolist()


def sample_async(
    sampler: Sampler, logits: torch.Tensor, keys: Sequence[int],
    also_copy: Callable[[torch.Tensor], None] | None = None,
) -> AsyncSample:
    """Sample logits [R, V] for `keys` (R may be 0: the event still marks the end of the step),
    queue the host copy, and `also_copy(tokens)`'s own copies (logprobs) before the event, so
    waiting on it covers them too."""
    if keys:
        tokens = sampler.sample(logits, keys)
    else:
        tokens = torch.empty(0, dtype=torch.int64, device=logits.device)
    host = to_host_async(tokens)
    if also_copy is not None:
        also_copy(tokens)
    done = None
    if tokens.device.type == "cuda":
        done = torch.cuda.Event()
        done.record()
    return AsyncSample(tokens, host, done)
