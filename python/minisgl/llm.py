"""Offline API, as vLLM's: LLM(model, **engine_args).generate(prompts, sampling_params) and .chat(messages)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

from tqdm import tqdm

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
from minisgl.startup_checks import check_model_path
from minisgl.tokenizer.chat import generation_prompts, opens_assistant_turn, render_chat
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer, TextStream
from minisgl.tokenizer.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompletionOutput:
    """One sample of a prompt (vLLM's name): sample `index` of SamplingParams.n."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] = ()  # when SamplingParams.logprobs is set


@dataclass(frozen=True)
class GenerationResult:
    """A prompt's samples, in order; text, token_ids, finish_reason and logprobs are the first's."""

    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # when SamplingParams.prompt_logprobs is set
    num_cached_tokens: int = 0  # prompt tokens the first sample reused from the prefix cache (vLLM's name)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> tuple[TokenLogprob, ...]:
        return self.outputs[0].logprobs


Prompt = Union[str, Sequence[int]]
Messages = Sequence[Mapping[str, Any]]


class LLM:
    """`LLM("/path")` or `LLM(model="/path")` (vLLM's keyword); without either, the embedded tiny
    model. `afd=AfdArgs(...)` runs the model disaggregated over worker processes; call close() (or
    use the LLM as a context manager) to stop them. generate() without sampling params uses the
    checkpoint's generation_config.json sampling defaults (`generation_config="ignore"`: none)."""

    def __init__(
        self, model_path: str | None = None, afd: AfdArgs | None = None, generation_config: str = "auto",
        *, model: str | None = None, **engine_args: object,
    ) -> None:
        if model is not None:
            if model_path is not None and model_path != model:
                raise ValueError(f"give the model once: model_path={model_path!r} and model={model!r}")
            model_path = model
        if model_path is not None:  # an HF id or a missing path gets its hint here
            check_model_path(model_path, engine_args.get("load_format", "auto"), contents=False)
        plan = resolve_plan(EngineArgs(model_path=model_path, **engine_args))
        self.sampling_defaults = load_sampling_defaults(plan.model_path, generation_config)
        logger.info("%s", self.sampling_defaults.describe())
        # The scheduler first: it reports a bad path or config before the tokenizer could.
        self.scheduler: RequestScheduler = build_scheduler(
            plan, afd, lambda skip: IncrementalDetokenizer(self.tokenizer, skip)
        )
        self.tokenizer = load_tokenizer(plan.model_path)
        self.generation_prompts = generation_prompts(self.tokenizer)
        # The colocated engine, for callers that inspect the pool or the model; None under AFD.
        self.engine: Engine | None = self.scheduler.engine if isinstance(self.scheduler, Scheduler) else None
        self._next_rid = 0

    def close(self) -> None:
        self.scheduler.close()

    def reset_prefix_cache(self) -> bool:
        """Drop the cached prompt prefixes (vLLM's name): later prompts reuse nothing cached before."""
        self.scheduler.flush_cache()
        return True

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[GenerationResult]:
        """One result per prompt, in order, each with SamplingParams.n samples. Prompts are strings or
        lists of token ids. use_tqdm: a progress bar of finished prompts."""
        return self._generate(prompts, sampling_params, use_tqdm, chat_turn=False)

    def _generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        chat_turn: bool,
    ) -> list[GenerationResult]:
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
                self.scheduler.validate(toks, p.for_choice(0))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from None
        # One engine request per sample: rids[i][j] is sample j of prompt i.
        numbers = iter(range(self._next_rid, self._next_rid + sum(p.n for p in params)))
        rids = [[f"offline-{next(numbers)}" for _ in range(p.n)] for p in params]
        self._next_rid += sum(p.n for p in params)
        for toks, p, prompt_rids in zip(ids, params, rids):
            # A prompt rendered with the chat template is a chat turn too (its next turn's prefix).
            turn = chat_turn or opens_assistant_turn(toks, self.generation_prompts)
            for j, rid in enumerate(prompt_rids):
                self.scheduler.add_request(GenerateRequest(rid, tuple(toks), p.for_choice(j), turn))
        outputs: dict[str, list[RequestOutput]] = {rid: [] for prompt_rids in rids for rid in prompt_rids}
        unfinished = {i: len(prompt_rids) for i, prompt_rids in enumerate(rids)}
        prompt_of = {rid: i for i, prompt_rids in enumerate(rids) for rid in prompt_rids}
        with tqdm(total=len(prompts), desc="Processed prompts", disable=not use_tqdm) as bar:
            while self.scheduler.has_work:
                for out in self.scheduler.step():
                    outputs[out.rid].append(out)
                    if out.finished:
                        unfinished[prompt_of[out.rid]] -= 1
                        bar.update(unfinished[prompt_of[out.rid]] == 0)
        errors = [o.error for outs in outputs.values() for o in outs if o.error]
        if errors:
            raise RuntimeError(errors[0])
        self.scheduler.check_integrity()
        return [self._result(toks, p, [outputs[rid] for rid in prompt_rids])
                for toks, p, prompt_rids in zip(ids, params, rids)]

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[GenerationResult]:
        """generate() on conversations ([{"role", "content"}, ...], or a list of them) rendered with
        the model's chat template, the assistant's turn opened (as vLLM's LLM.chat)."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        if not conversations:
            raise ValueError("no conversations given")
        prompts = [self.tokenizer.encode(render_chat(self.tokenizer, [dict(m) for m in c], None,
                                                     chat_template_kwargs), add_special_tokens=False)
                   for c in conversations]  # the template wrote the special tokens
        return self._generate(prompts, sampling_params, use_tqdm, chat_turn=True)

    def _result(
        self, prompt: list[int], params: SamplingParams, samples: list[list[RequestOutput]]
    ) -> GenerationResult:
        completions = []
        for j, outs in enumerate(samples):
            tokens = tuple(t for o in outs for t in o.new_token_ids)
            text = TextStream(self.tokenizer, params.skip_special_tokens, params.stop, params.min_tokens)
            completions.append(CompletionOutput(j, text.push(tokens, finished=True), tokens, outs[-1].finish_reason,
                                                tuple(e for o in outs for e in o.logprobs)))
        prompt_lp = next((o.prompt_logprobs for o in samples[0] if o.prompt_logprobs is not None), None)
        return GenerationResult(tuple(prompt), tuple(completions), prompt_lp, samples[0][-1].num_cached_tokens)
