"""Offline API: LLM(model_path, **engine_args).generate(prompts, sampling_params)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from minisgl.afd.args import AfdArgs
from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_defaults import load_sampling_defaults
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest, RequestOutput, TokenLogprob
from minisgl.scheduler.protocol import RequestScheduler
from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler_factory import build_scheduler
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer, TextStream
from minisgl.tokenizer.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationResult:
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] = ()  # when SamplingParams.logprobs is set
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # when SamplingParams.prompt_logprobs is set


class LLM:
    """`afd=AfdArgs(...)` runs the model disaggregated over worker processes; call close() (or use
    the LLM as a context manager) to stop them. generate() without sampling params uses the
    checkpoint's generation_config.json sampling defaults (`generation_config="ignore"`: none)."""

    def __init__(
        self, model_path: str | None = None, afd: AfdArgs | None = None, generation_config: str = "auto",
        **engine_args: object,
    ) -> None:
        plan = resolve_plan(EngineArgs(model_path=model_path, **engine_args))
        self.sampling_defaults = load_sampling_defaults(plan.model_path, generation_config)
        logger.info("%s", self.sampling_defaults.describe())
        # The scheduler first: it reports a bad path or config before the tokenizer could.
        self.scheduler: RequestScheduler = build_scheduler(
            plan, afd, lambda skip: IncrementalDetokenizer(self.tokenizer, skip)
        )
        self.tokenizer = load_tokenizer(plan.model_path)
        # The colocated engine, for callers that inspect the pool or the model; None under AFD.
        self.engine: Engine | None = self.scheduler.engine if isinstance(self.scheduler, Scheduler) else None
        self._next_rid = 0

    def close(self) -> None:
        self.scheduler.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[GenerationResult]:
        """One result per prompt, in order. Prompts are strings or lists of token ids."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("no prompts given")
        params = SamplingParams.broadcast(
            self.sampling_defaults.params() if sampling_params is None else sampling_params, len(prompts)
        )
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        # Validate everything before queueing anything, so a bad prompt leaves no request behind.
        for i, (toks, p) in enumerate(zip(ids, params)):
            try:
                self.scheduler.validate(toks, p)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        rids = [f"offline-{self._next_rid + i}" for i in range(len(ids))]
        self._next_rid += len(ids)
        for rid, toks, p in zip(rids, ids, params):
            self.scheduler.add_request(GenerateRequest(rid, tuple(toks), p))
        outputs: dict[str, list[RequestOutput]] = {rid: [] for rid in rids}
        while self.scheduler.has_work:
            for out in self.scheduler.step():
                outputs[out.rid].append(out)
        errors = [o.error for outs in outputs.values() for o in outs if o.error]
        if errors:
            raise RuntimeError(errors[0])
        self.scheduler.check_integrity()
        return [self._result(toks, p, outputs[rid]) for rid, toks, p in zip(rids, ids, params)]

    def _result(self, prompt: list[int], params: SamplingParams, outs: list[RequestOutput]) -> GenerationResult:
        tokens = tuple(t for o in outs for t in o.new_token_ids)
        text = TextStream(self.tokenizer, params.skip_special_tokens, params.stop, params.min_tokens)
        text = text.push(tokens, finished=True)
        prompt_lp = next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
        return GenerationResult(
            tuple(prompt), tokens, text, outs[-1].finish_reason, tuple(e for o in outs for e in o.logprobs), prompt_lp
        )
