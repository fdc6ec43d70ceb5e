"""Per-request sampling parameters, validated on construction (ranges and meanings as vLLM's)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs allows
GREEDY_BELOW = 1e-5  # temperatures under this sample greedily
MAX_PENALTY = 2.0  # |presence_penalty| and |frequency_penalty|, as OpenAI allows
MAX_LOGIT_BIAS = 100.0  # logit_bias values are clamped to +-this (OpenAI's range)

LogitBias = tuple[tuple[int, float], ...]


def _logit_bias(bias: Mapping[int | str, float] | Sequence[tuple[int, float]] | None) -> LogitBias:
    """(token id, bias) pairs sorted by id, each bias clamped to the OpenAI range as vLLM does."""
    items = bias.items() if isinstance(bias, Mapping) else (bias or ())
    out: dict[int, float] = {}
    for tok, value in items:
        try:
            tid = int(tok) if isinstance(tok, (int, str)) and not isinstance(tok, bool) else -1
        except ValueError:
            tid = -1
        if tid < 0:
            raise ValueError(f"logit_bias keys must be token ids, got {tok!r}")
        value = float(value)
        if value != value:
            raise ValueError(f"logit_bias[{tid}] is NaN")
        out[tid] = min(MAX_LOGIT_BIAS, max(-MAX_LOGIT_BIAS, value))
    return tuple(sorted(out.items()))


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
    # Drop tokens whose probability (after temperature) is below min_p times the top token's.
    min_p: float = 0.0
    # Logits of tokens seen in the prompt or the output: positive ones divided by it, negative ones multiplied.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    min_tokens: int = 0  # EOS and stop_token_ids are masked, and stop strings unchecked, until this many tokens
    logit_bias: LogitBias = ()  # (token id, bias) added to the logits; a dict {id: bias} is accepted too
    # Samples per prompt (vLLM's n). The caller fans them out into n engine requests (for_choice);
    # one engine request samples once.
    n: int = 1

    def __post_init__(self) -> None:
        # Accept lists (and a bare string for `stop`) the way the OpenAI API does.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in (self.stop_token_ids or ())))
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0 or self.repetition_penalty == float("inf"):
            raise ValueError(f"repetition_penalty must be > 0 and finite, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {getattr(self, name)}")
        if self.max_tokens < 0 or (self.max_tokens == 0 and self.prompt_logprobs is None):
            raise ValueError(f"max_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt), got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")

    def for_choice(self, j: int) -> "SamplingParams":
        """The engine request of sample j of n: with a seed, each sample gets its own stream (seed + j),
        all reproducible."""
        return replace(self, n=1, seed=None if self.seed is None else self.seed + j)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if logit_bias names a token the model does not have."""
        bad = [t for t, _ in self.logit_bias if t >= vocab_size]
        if bad:
            raise ValueError(f"logit_bias token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        # Dividing logits by a temperature this small overflows to inf (and NaN probabilities).
        return self.temperature < GREEDY_BELOW

    @property
    def penalised(self) -> bool:
        """Needs the request's token history (prompt and output) on the device."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

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
