"""Offline API: LLM(model_path, **engine_args).generate(prompts, sampling_params)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.scheduler import Scheduler
from minisgl.tokenizer.tokenizer import load_tokenizer


@dataclass(frozen=True)
class GenerationResult:
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str


class LLM:
    def __init__(self, model_path: str | None = None, **engine_args: object) -> None:
        self.engine = Engine(EngineArgs(model_path=model_path, **engine_args))
        self.tokenizer = load_tokenizer(self.engine.model_path)
        self.scheduler = Scheduler(self.engine, self._decode)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

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
        params = SamplingParams.broadcast(sampling_params, len(prompts))
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        # Validate everything before queueing anything, so a bad prompt leaves no request behind.
        for i, (toks, p) in enumerate(zip(ids, params)):
            try:
                self.scheduler.validate(toks, p)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        reqs = [self.scheduler.add_request(t, p) for t, p in zip(ids, params)]
        while self.scheduler.has_work:
            self.scheduler.step()
        self.engine.pool.check_integrity()
        return [
            GenerationResult(
                tuple(r.prompt_ids),
                tuple(r.output_ids),
                r.stop_text if r.stop_text is not None else self._decode(r.output_ids),
                r.finish_reason,
            )
            for r in reqs
        ]
