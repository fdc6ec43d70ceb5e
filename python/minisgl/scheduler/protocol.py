"""The interface the engine process and the offline LLM drive, so that the colocated Scheduler and
the AFD coordinator are interchangeable behind the same server.

A driver loop looks like:

    sched.validate(ids, params)    # raises ValueError (with a message) if it could never run
    sched.add_request(req)         # validates too; queues without allocating
    sched.abort(rid)               # frees its pages and slot now; its final output says "abort"
    while sched.has_work:
        for out in sched.step():   # one forward (or none, if only aborts/rejects are pending)
            ...                    # RequestOutput: new tokens, logprobs, finish reason
    sched.check_integrity()        # when idle: every page and slot is accounted for
    sched.flush_cache()            # drop the cached prompt prefixes
    sched.close()                  # at shutdown
"""
from __future__ import annotations

from typing import Protocol

from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest, RequestOutput, SchedulerInfo, SchedulerStats


class RequestScheduler(Protocol):
    info: SchedulerInfo

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError (with a message) if this request could never run."""

    def add_request(self, req: GenerateRequest) -> None:
        """Queue req, or raise ValueError without allocating anything if it can never run."""

    def abort(self, rid: str) -> None:
        """Drop rid wherever it is, freeing its resources at once; unknown rids are ignored."""

    def step(self) -> list[RequestOutput]:
        """Advance every running request by one step; return what changed. Raises when nothing can
        be served any more (an AFD worker died): every request is gone with it."""

    @property
    def has_work(self) -> bool:
        """True while step() has anything to do or report."""

    def check_integrity(self) -> None:
        """Raise AssertionError if the pools lost or double-counted a page or slot."""

    def stats(self) -> SchedulerStats: ...

    def flush_cache(self) -> int:
        """Drop every cached prompt prefix (running requests keep what they borrowed); returns how
        many there were. Requests queued after the call find none."""

    def close(self) -> None:
        """Release what the scheduler started (worker processes, sockets); safe to call twice."""


def run_to_end(sched: RequestScheduler, reqs: list[GenerateRequest]) -> dict[str, list[RequestOutput]]:
    """Queue `reqs` and step until nothing is left: every request's outputs, in order, by rid; the
    pools are then checked (the driver loop above, for scripts and tests)."""
    for req in reqs:
        sched.add_request(req)
    outs: dict[str, list[RequestOutput]] = {req.rid: [] for req in reqs}
    while sched.has_work:
        for out in sched.step():
            outs[out.rid].append(out)
    sched.check_integrity()
    return outs
