"""--log-requests: a line when a request arrives (its response id, its choices' engine ids, prompt
tokens and the sampling parameters it set) and one when each choice finishes (finish reason, token
counts, latency and the start of its text), as SGLang's and vLLM's request logs give."""
from __future__ import annotations

import dataclasses
import logging
import time

from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest, RequestOutput

logger = logging.getLogger("minisgl.requests")
TEXT_PREVIEW = 200  # characters of the output text a finish line shows

_DEFAULT_PARAMS = SamplingParams()


def _set_fields(params: SamplingParams) -> dict[str, object]:
    """The fields that differ from SamplingParams' defaults: what the request asked for."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if getattr(params, f.name) != getattr(_DEFAULT_PARAMS, f.name)}


class RequestLog:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._started: dict[str, float] = {}  # rid -> arrival
        self._text: dict[str, list[str]] = {}  # rid -> its text so far

    def received(self, request_id: str, reqs: list[GenerateRequest]) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        for r in reqs:
            self._started[r.rid], self._text[r.rid] = now, []
        first = reqs[0]
        logger.info("Receive: id=%s, rids=%s, prompt_tokens=%s, params=%s", request_id, [r.rid for r in reqs],
                    [len(r.prompt_ids) for r in reqs], _set_fields(first.params))

    def on_output(self, o: RequestOutput) -> None:
        if not self.enabled or o.rid not in self._started:
            return
        self._text[o.rid].append(o.text)
        if o.finished:
            seconds = time.perf_counter() - self._started.pop(o.rid)
            text = "".join(self._text.pop(o.rid))
            logger.info("Finish: rid=%s, finish_reason=%s, prompt_tokens=%d, completion_tokens=%d, cached_tokens=%d, "
                        "e2e_latency=%.3f s, text=%r%s", o.rid, o.finish_reason, o.num_prompt_tokens,
                        o.num_output_tokens, o.num_cached_tokens, seconds, text[:TEXT_PREVIEW],
                        "..." if len(text) > TEXT_PREVIEW else "")

    def forget(self, rids: tuple[str, ...]) -> None:
        """Choices that ended without a finish output (client gone, engine dead)."""
        for rid in rids:
            if self._started.pop(rid, None) is not None:
                self._text.pop(rid, None)
                logger.info("Finish: rid=%s, finish_reason=abort (no final output: client gone or engine stopped)",
                            rid)
