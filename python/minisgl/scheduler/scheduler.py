"""Continuous batching: each step runs every decoding request plus prefill chunks within the
prefill token budget, admitting waiting requests first-come first-served while the pool can
reserve their pages and a state slot. A request that does not fit yet waits; one that can never
fit is rejected before anything is allocated."""
from __future__ import annotations

from collections import deque
from typing import Callable

import torch

from minisgl.engine.engine import Engine
from minisgl.engine.sampler import sample
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.request import FINISH_LENGTH, FINISH_STOP, Request


class Scheduler:
    def __init__(self, engine: Engine, detokenize: Callable[[list[int]], str] | None = None) -> None:
        self.engine = engine
        self.pool = engine.pool
        self.max_seq_len = engine.max_seq_len
        self.prefill_budget = engine.args.chunked_prefill_size
        self.eos = frozenset(engine.config.eos_token_ids)
        self.detokenize = detokenize
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._next_rid = 0
        self._default_generator = torch.Generator(device=engine.device).manual_seed(engine.args.seed)

    # -- admission ------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) >= self.max_seq_len:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; max_seq_len is {self.max_seq_len}, "
                f"so at most {self.max_seq_len - 1} prompt tokens leave room to generate"
            )
        vocab = self.engine.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if params.stop and self.detokenize is None:
            raise ValueError("stop strings need a tokenizer")

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        self.validate(prompt_ids, params)
        generator = None
        if not params.greedy:
            generator = self._default_generator
            if params.seed is not None:
                generator = torch.Generator(device=self.engine.device).manual_seed(params.seed)
        req = Request(self._next_rid, list(prompt_ids), params, generator)
        self._next_rid += 1
        self.waiting.append(req)
        return req

    def _reserve_tokens(self, req: Request) -> int:
        return min(len(req.prompt_ids) + req.params.max_tokens, self.max_seq_len)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -------------------------------------------------------------------------------
    def _schedule(self) -> list[tuple[Request, list[int]]]:
        items = [(r, [r.output_ids[-1]]) for r in self.running if r.prefill_done]
        budget = self.prefill_budget
        for r in self.running:
            if not r.prefill_done and budget > 0:
                items.append(self._chunk(r, budget))
                budget -= len(items[-1][1])
        while self.waiting and budget > 0 and self.pool.can_allocate(self._reserve_tokens(self.waiting[0])):
            r = self.waiting.popleft()
            r.slot = self.pool.allocate(self._reserve_tokens(r))
            self.running.append(r)
            items.append(self._chunk(r, budget))
            budget -= len(items[-1][1])
        return items

    @staticmethod
    def _chunk(r: Request, budget: int) -> tuple[Request, list[int]]:
        n = min(len(r.prompt_ids) - r.num_computed, budget)
        return r, r.prompt_ids[r.num_computed : r.num_computed + n]

    def step(self) -> list[Request]:
        """Runs one forward over the scheduled batch; returns the requests that finished."""
        items = self._schedule()
        if not items:
            if self.waiting:
                raise RuntimeError("scheduler stalled: nothing running and the first waiting request does not fit")
            return []
        for r, toks in items:
            self.pool.ensure_tokens(r.slot, r.num_computed + len(toks))
        batch = self.engine.make_batch([t for _, t in items], [r.num_computed for r, _ in items], [r.slot for r, _ in items])
        logits = self.engine.forward_batch(batch)
        rows: list[int] = []
        for i, (r, toks) in enumerate(items):
            r.num_computed += len(toks)
            if r.num_computed == r.seq_len:  # caught up: this step's last logits predict a new token
                rows.append(i)
        reqs = [items[i][0] for i in rows]
        tokens = sample(logits[rows], [r.params for r in reqs], [r.generator for r in reqs])
        finished = []
        for r, tok in zip(reqs, tokens):
            r.output_ids.append(tok)
            self._check_finish(r, tok)
            if r.finished:
                finished.append(r)
        for r in finished:
            self.release(r)
        return finished

    def _check_finish(self, r: Request, tok: int) -> None:
        p = r.params
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos):
            r.finish_reason = FINISH_STOP
        elif p.stop:
            text = self.detokenize(r.output_ids)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                r.finish_reason, r.stop_text = FINISH_STOP, text[: min(hits)]
        if r.finish_reason is None and (len(r.output_ids) >= p.max_tokens or r.seq_len >= self.max_seq_len):
            r.finish_reason = FINISH_LENGTH

    def release(self, r: Request) -> None:
        if r in self.running:
            self.running.remove(r)
        if r.slot is not None:
            self.pool.free(r.slot)
            r.slot = None
