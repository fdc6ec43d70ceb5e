"""The colocated scheduler: continuous batching over one Engine (implements RequestScheduler).

Each step runs every decoding request plus prefill chunks: each chunk at most
chunked_prefill_size tokens (more in a step without decodes whose budget has room no other prompt
can take: prefill_budget.py), all of them at most max_prefill_tokens. Waiting requests are admitted
first-come first-served while the pool can reserve their pages (for prompt + max_tokens) and a
state slot; one that does not fit yet waits, one that can never fit is rejected by add_request.

Overlap (CUDA only): step() launches step t+1 before it retires step t. Decode inputs of t+1 are
the tokens t sampled, read on the device; the CPU sees them one step later, so finish detection
(EOS, stop) lags by a step and the overshoot token is dropped. Length finishes never overshoot:
a request that has sampled max_tokens is not scheduled again. Freeing a finished request's pages
while step t+1 may still write them is safe: the device runs steps in stream order.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import torch

from minisgl.engine import compile_watch
from minisgl.engine.async_sample import AsyncSample, request_generator, sample_async
from minisgl.engine.engine import Engine
from minisgl.engine.sampler import Sampler
from minisgl.forward_batch import Snapshot
from minisgl.host_copy import take_rows, to_device, to_host_async
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.args import SchedulerArgs, overlap_enabled
from minisgl.scheduler.messages import (
    FINISH_ABORT,
    FINISH_LENGTH,
    GenerateRequest,
    RequestOutput,
    SchedulerInfo,
    SchedulerStats,
    TokenLogprob,
)
from minisgl.scheduler.logprobs import LogprobTensors, compute_logprobs, to_entries
from minisgl.scheduler.request import Request
from minisgl.scheduler.rules import (abort_request, check_finish, new_request, order_by_cached_prefix, plan_batch,
                                     take_outputs, validate_request)
from minisgl.scheduler.stop import DecoderFactory


@dataclass
class _Step:
    """A launched forward. Its host tensors may still be in flight until `done` fires."""

    sampled: list[Request]  # requests that sampled a token, in row order
    sample: AsyncSample | None = None  # their tokens; sample.tokens are the next step's decode inputs
    lp_rows: list[int] = field(default_factory=list)  # rows of `sampled` that want logprobs
    logprobs: LogprobTensors | None = None
    prompt_lp: list[tuple[Request, list[int]]] = field(default_factory=list)  # request, target tokens
    prompt_logprobs: LogprobTensors | None = None
    scored: list[Request] = field(default_factory=list)  # max_tokens=0 requests whose prompt is done


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        make_decoder: DecoderFactory | None = None,
        args: SchedulerArgs = SchedulerArgs(),
        overlap: bool | None = None,
    ) -> None:
        self.engine = engine
        self.pool = engine.pool
        self.max_seq_len = engine.max_seq_len
        self.chunk_size = engine.plan.args.chunked_prefill_size
        self.prefill_budget = args.max_prefill_tokens
        self.lpm = args.schedule_policy == "lpm" and engine.pool.cfg.prefix_cache
        self.per_request = engine.plan.args.prefill_tokens_per_request
        self.overlap = overlap_enabled(engine.device) if overlap is None else overlap
        self.eos = frozenset(engine.config.eos_token_ids)
        self.make_decoder = make_decoder
        self.info = SchedulerInfo(
            model_path=engine.model_path,
            max_seq_len=self.max_seq_len,
            vocab_size=engine.config.vocab_size,
            page_size=self.pool.page_size,
            total_pages=self.pool.total_pages,
            max_running_requests=self.pool.max_running,
            device=str(engine.device),
            startup_seconds=engine.startup_seconds,
            **engine.warmup_summary(),
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._reqs: dict[str, Request] = {}
        self._outbox: list[RequestOutput] = []  # aborts, reported at the next step
        self._inflight: _Step | None = None
        self._integrity_checks = 0
        self._default_generator = torch.Generator(device=engine.device).manual_seed(engine.plan.args.seed)
        self.sampler = Sampler(engine.config.vocab_size, engine.device, self.eos, self.pool.max_running)

    # -- admission ------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        validate_request(
            prompt_ids, params, self.max_seq_len, self.engine.config.vocab_size, self.make_decoder is not None
        )

    def add_request(self, req: GenerateRequest) -> None:
        self.validate(list(req.prompt_ids), req.params)
        if req.rid in self._reqs:
            raise ValueError(f"request id {req.rid!r} is already in use")
        r = new_request(req, self.make_decoder, request_generator(req.params, self._default_generator))
        self._reqs[r.rid] = r
        self.waiting.append(r)
        if r.prompt_logprobs is None:
            self.pool.note_prompt(r.prompt_ids)
            if self.lpm:
                r.prefix_keys = self.pool.prompt_keys(r.prompt_ids)

    def abort(self, rid: str) -> None:
        r = self._reqs.get(rid)
        if r is not None:
            self._outbox.append(abort_request(r, self.waiting, self._forget, self._release))

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._outbox or self._inflight)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            used_pages=self.pool.total_pages - self.pool.free_pages - self.pool.evictable_pages,  # as SGLang counts
            total_pages=self.pool.total_pages,
            used_slots=self.pool.used_slots,
            total_slots=self.pool.max_running,
            integrity_checks=self._integrity_checks,
            compiles=compile_watch.compile_count(),
            cached_prefixes=self.pool.cached_prefixes,
            cached_pages=self.pool.evictable_pages,
        )

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        tracked = set(map(id, self.waiting)) | set(map(id, self.running))
        if tracked != set(map(id, self._reqs.values())) or any(r.slot is None for r in self.running):
            raise AssertionError("scheduler lost track of a request: waiting + running != live requests")
        self._integrity_checks += 1

    def flush_cache(self) -> int:
        return self.pool.flush_cache()

    def close(self) -> None:
        """Stop the engine's TP followers, if it has any (the engine itself lives and dies with this process)."""
        self.engine.close()

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Launch the next forward and retire the previous one (or this one, without overlap)."""
        outputs, self._outbox = self._outbox, []
        launched = self._launch()
        if self.overlap:
            retiring, self._inflight = self._inflight, launched
        else:
            retiring = launched
        if retiring is not None:
            outputs += self._retire(retiring)
        if launched is None and retiring is None and not outputs and self.waiting:
            raise RuntimeError("scheduler stalled: nothing running and the first waiting request does not fit")
        return outputs

    def _schedule(self) -> list[tuple[Request, int]]:
        if self.lpm:
            order_by_cached_prefix(self.waiting, lambda r: self.pool.cached_len(r.prompt_ids, r.prefix_keys))
        return plan_batch(self.running, self.waiting, self.pool, self.max_seq_len, self.chunk_size, self.prefill_budget,
                          self.per_request)

    def _input_tokens(self, r: Request, n: int) -> list[int]:
        if r.num_computed < len(r.prompt_ids):
            return r.prompt_ids[r.num_computed : r.num_computed + n]
        return [0] if r.num_pending else [r.output_ids[-1]]  # 0: patched from the device below

    @staticmethod
    def _prompt_logprob_rows(
        items: list[tuple[Request, int]], tokens: list[list[int]]
    ) -> tuple[list[tuple[Request, list[int]]], list[int]]:
        """For the prompt_logprobs requests in a step: (request, the prompt tokens its rows predict)
        and the flat batch rows whose logits score them."""
        scored: list[tuple[Request, list[int]]] = []
        rows: list[int] = []
        for (r, _), start, fed in zip(items, itertools.accumulate((len(t) for t in tokens), initial=0), tokens):
            if r.prompt_logprobs is not None and not r.prefill_done:
                targets = r.prompt_ids[r.num_computed + 1 : r.num_computed + 1 + len(fed)]
                if targets:
                    scored.append((r, targets))
                    rows.extend(range(start, start + len(targets)))
        return scored, rows

    def _snapshots(self, items: list[tuple[Request, int]]) -> list[Snapshot]:
        """The prefixes this step's prompts pass to cache (their checkpoints inside it): the step
        writes each one's state to a slot of the cache as it passes it, with no stop there. (One
        that the step ends at is cached from the request's slot after it: _launch.)"""
        snapshots = []
        for i, (r, n) in enumerate(items):
            if n == 1:  # a decode (or a prompt's last token): nothing inside it
                continue
            for at in r.checkpoints:
                if r.num_computed < at < r.num_computed + n:
                    kept = self.pool.snapshot_prefix(r.slot, r.prompt_ids[:at])
                    if kept is not None:
                        snapshots.append(Snapshot(i, at - r.num_computed, kept))
        return snapshots

    def _launch(self) -> _Step | None:
        items = self._schedule()
        if not items:
            return None
        tokens = [self._input_tokens(r, n) for r, n in items]
        for (r, n), toks in zip(items, tokens):
            self.pool.ensure_tokens(r.slot, r.num_computed + n)
            if r.num_computed == r.num_cached:  # its first step
                self.sampler.add(r.slot, r.params, r.generator)
                self.sampler.see_prompt(r.slot, r.prompt_ids[: r.num_cached])
            if not r.prefill_done:
                self.sampler.see_prompt(r.slot, toks)
        batch = self.engine.make_batch(tokens, [r.num_computed for r, _ in items], [r.slot for r, _ in items],
                                       self._snapshots(items))
        pending = [(i, r.pending_row) for i, (r, _) in enumerate(items) if r.prefill_done and r.num_pending]
        if pending:
            dst, src = zip(*pending)
            batch.input_ids[take_rows(batch.logit_idx, dst)] = take_rows(self._inflight.sample.tokens, src)
        step_prompt_lp, prompt_rows = self._prompt_logprob_rows(items, tokens)
        if prompt_rows:  # the scored prompt rows first, then every request's last token
            rows = torch.cat([to_device(prompt_rows, torch.int64, batch.logit_idx.device), batch.logit_idx])
            logits = self.engine.forward_batch(batch, rows)
            prompt_logits, logits = logits[: len(prompt_rows)], logits[len(prompt_rows) :]
        else:
            logits = self.engine.forward_batch(batch)
        for r, n in items:
            r.num_computed += n
            if r.num_computed in r.checkpoints:  # the slot's state once this step's forward has run
                self.pool.cache_prefix(r.slot, r.prompt_ids[: r.num_computed])
        sample_rows = [i for i, (r, _) in enumerate(items) if r.num_computed == r.seq_len and r.params.max_tokens > 0]
        sampled = [items[i][0] for i in sample_rows]
        sampled_logits = take_rows(logits, sample_rows)
        scored = [r for r, _ in items if r.prefill_done and r.params.max_tokens == 0]
        for row, r in enumerate(sampled):
            r.num_pending += 1
            r.pending_row = row
        step = _Step(sampled, scored=scored)
        step.lp_rows = [row for row, r in enumerate(sampled) if r.params.logprobs is not None]

        def copy_logprobs(tokens: torch.Tensor) -> None:
            if step.lp_rows:
                k = max(sampled[row].params.logprobs for row in step.lp_rows)
                lp = compute_logprobs(take_rows(sampled_logits, step.lp_rows), take_rows(tokens, step.lp_rows), k)
                step.logprobs = lp.map(to_host_async)
            if step_prompt_lp:
                k = max(r.params.prompt_logprobs for r, _ in step_prompt_lp)
                targets = to_device([t for _, ts in step_prompt_lp for t in ts], torch.int64, logits.device)
                step.prompt_lp = step_prompt_lp
                step.prompt_logprobs = compute_logprobs(prompt_logits, targets, k).map(to_host_async)

        step.sample = sample_async(self.sampler, sampled_logits, [r.slot for r in sampled], copy_logprobs)
        return step

    def _retire(self, step: _Step) -> list[RequestOutput]:
        tokens = step.sample.wait()  # the logprobs' copies were queued before its event
        touched: dict[int, Request] = {}
        if step.prompt_logprobs is not None:
            targets = [t for _, ts in step.prompt_lp for t in ts]
            ks = [r.params.prompt_logprobs for r, ts in step.prompt_lp for _ in ts]
            entries = iter(to_entries(step.prompt_logprobs, targets, ks))
            for r, ts in step.prompt_lp:
                r.prompt_logprobs.extend(next(entries) for _ in ts)
        for r in step.scored:
            if not r.finished:
                r.finish_reason = FINISH_LENGTH
                touched[id(r)] = r
        lp_entries: dict[int, TokenLogprob] = {}
        if step.logprobs is not None:
            rows = step.lp_rows
            ks = [step.sampled[row].params.logprobs for row in rows]
            lp_entries = dict(zip(rows, to_entries(step.logprobs, [tokens[row] for row in rows], ks)))
        for row, (r, tok) in enumerate(zip(step.sampled, tokens)):
            r.num_pending -= 1
            if r.finished:  # aborted, or the overshoot of a finish the previous step found
                continue
            r.output_ids.append(tok)
            if row in lp_entries:
                r.new_logprobs.append(lp_entries[row])
            check_finish(r, tok, self.eos, self.max_seq_len)
            touched[id(r)] = r
        return take_outputs(touched.values(), self._release)

    def _release(self, r: Request) -> None:
        self.running.remove(r)
        self.sampler.remove(r.slot)
        # What it fed stays for the prompt that continues it (an agent's next call); the slot's state
        # is the state after those tokens once the steps in flight have run.
        fed = (r.prompt_ids + r.output_ids)[: r.num_computed]
        if r.finish_reason == FINISH_ABORT or r.prompt_logprobs is not None or not self.pool.park(r.slot, fed):
            self.pool.free(r.slot)
        r.slot = None
        self._forget(r)

    def _forget(self, r: Request) -> None:
        self._reqs.pop(r.rid, None)
