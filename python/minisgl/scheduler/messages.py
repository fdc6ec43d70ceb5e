"""What goes into and comes out of a scheduler: plain frozen dataclasses, so they cross process
boundaries (msgpack) unchanged and any scheduler (colocated or the AFD coordinator) speaks them."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.sampling_params import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    # A chat conversation rendered by the server's template: its next turn re-renders the end of
    # this prompt, so the prefix cache keeps a state shortly before that end (allocator.py).
    chat_turn: bool = False


@dataclass(frozen=True)
class TokenLogprob:
    """One position's logprob: the token there, its logprob and rank (1 = most likely) under the
    model, and the top alternatives as (token id, logprob), best first."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """What one step changed for one request: the tokens it produced and, once, how it ended.

    prompt_logprobs is sent once, with the first output, aligned to the prompt (the first
    position has no logprob: None). error is set when the request was rejected; it never ran.
    text is the new text; schedulers leave it empty and the server's detokenizer fills it in."""

    rid: str
    new_token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    finish_reason: str | None = None
    matched_stop: str | int | None = None  # the stop string or stop token id that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_output_tokens: int = 0
    error: str | None = None
    text: str = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class SchedulerInfo:
    """Fixed limits, published once so the API server can reject what can never run."""

    model_path: str
    max_seq_len: int
    vocab_size: int
    page_size: int
    total_pages: int
    max_running_requests: int
    device: str
    startup_seconds: float = 0.0  # engine construction: load, plan, warm up
    warmup_seconds: float = 0.0
    warmup_compiles: int = 0  # Triton compiles and autotuning runs during warm-up
    memory: str = ""  # the memory planner's summary (GPU)
    piecewise_graph_buckets: tuple[int, ...] = ()  # token counts of prefill/mixed steps replayed from graphs
    piecewise_graph_gib: float = 0.0  # device memory those graphs hold
    supports_logprobs: bool = True  # logprobs and prompt_logprobs can be asked for


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    used_pages: int
    total_pages: int
    used_slots: int
    total_slots: int
    integrity_checks: int  # how many times check_integrity has run and passed (the driver runs it when idle)
    compiles: int = 0  # Triton compiles and autotuning runs in the engine process since it started
    cached_prefixes: int = 0  # entries the prefix cache keeps (shared prefixes and parked sequences)
    cached_pages: int = 0  # pages only the prefix cache holds (free for the taking; not in used_pages)
