"""Per-request sampling parameters, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs allows
GREEDY_BELOW = 1e-5  # temperatures under this sample greedily


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 (or < GREEDY_BELOW) = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # top-k alternatives per output token; None = no logprobs, 0 = the chosen token's only
    prompt_logprobs: int | None = None  # the same for every prompt token after the first (vLLM's extension)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        # Accept lists (and a bare string for `stop`) the way the OpenAI API does.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in (self.stop_token_ids or ())))
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens < 0 or (self.max_tokens == 0 and self.prompt_logprobs is None):
            raise ValueError(f"max_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt), got {self.max_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        # Dividing logits by a temperature this small overflows to inf (and NaN probabilities).
        return self.temperature < GREEDY_BELOW

    @staticmethod
    def broadcast(params: "SamplingParams | Sequence[SamplingParams] | None", n: int) -> list["SamplingParams"]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        params = list(params)
        if len(params) != n:
            raise ValueError(f"got {len(params)} sampling params for {n} prompts")
        return params
