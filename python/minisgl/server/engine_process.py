"""The engine process: feeds the API server's requests to a RequestScheduler, steps it while it has
work, and streams its outputs to the detokenizer. When idle it runs the pools' integrity check;
every STATS_INTERVAL it reports stats, which double as the watchdog's heartbeat; every
--decode-log-interval decode steps it logs a stats line (server/stats_log.py).

The scheduler comes from scheduler_factory.build_scheduler: the colocated Scheduler, or with
--afd the AFD coordinator (which starts its worker processes from here).
"""
from __future__ import annotations

import logging
import os
import time

from minisgl.engine.plan import EnginePlan
from minisgl.afd.args import AfdArgs
from minisgl.scheduler.args import SchedulerArgs
from minisgl.scheduler_factory import build_scheduler
from minisgl.scheduler.messages import FINISH_ABORT, GenerateRequest, RequestOutput
from minisgl.scheduler.protocol import RequestScheduler
from minisgl.server.channel import Addresses, Receiver, Sender
from minisgl.server.child import parent_alive, setup_child
from minisgl.server.messages import (
    AbortRequest,
    DetokSpec,
    EngineDead,
    EngineReady,
    EngineStats,
    FlushCache,
    TokenBatch,
)
from minisgl.server.stats_log import StatsLine
from minisgl.tokenizer.detokenizer import IncrementalDetokenizer
from minisgl.tokenizer.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

STATS_INTERVAL = 0.5  # seconds
IDLE_POLL_MS = 200


class EngineLoop:
    def __init__(
        self, sched: RequestScheduler, inbox: Receiver, out: Sender, parent_pid: int, decode_log_interval: int = 0
    ) -> None:
        self.sched = sched
        self.stats_line = StatsLine(decode_log_interval, sched.info.page_size)
        self.inbox = inbox
        self.out = out
        self.parent_pid = parent_pid
        self._specs: dict[str, DetokSpec] = {}  # until the request's first output carries it
        self._rejected: list[RequestOutput] = []
        self._last_stats = 0.0

    def _handle(self, msg: object) -> None:
        if isinstance(msg, GenerateRequest):
            try:
                self.sched.add_request(msg)
            except ValueError as e:
                self._rejected.append(RequestOutput(msg.rid, finish_reason=FINISH_ABORT, error=str(e)))
                return
            self._specs[msg.rid] = DetokSpec(msg.params.skip_special_tokens, msg.params.stop, msg.params.min_tokens)
            self.stats_line.on_request(msg.rid, len(msg.prompt_ids))
        elif isinstance(msg, AbortRequest):
            self.sched.abort(msg.rid)
        elif isinstance(msg, FlushCache):
            logger.info("prefix cache flushed: %d prefixes dropped", self.sched.flush_cache())
        else:
            raise TypeError(f"engine got an unexpected message: {type(msg).__name__}")

    def _send(self, outputs: list[RequestOutput]) -> None:
        outputs, self._rejected = self._rejected + outputs, []
        if outputs:
            specs = tuple((o.rid, self._specs.pop(o.rid)) for o in outputs if o.rid in self._specs)
            self.out.send(TokenBatch(tuple(outputs), specs))

    def _send_stats(self, idle_checked: bool) -> None:
        self.out.send(EngineStats(self.sched.stats(), idle_checked))
        self._last_stats = time.monotonic()

    def run(self) -> None:
        self.out.send(EngineReady(self.sched.info, os.getpid()))
        idle_checked = False
        while parent_alive(self.parent_pid):
            for msg in self.inbox.recv_all(0 if self.sched.has_work or self._rejected else IDLE_POLL_MS):
                self._handle(msg)
            if self.sched.has_work:
                if idle_checked:  # announce the end of idleness before any output of this work
                    idle_checked = False
                    self._send_stats(idle_checked)
                outputs = self.sched.step()
                self.stats_line.on_step(outputs)
                self._send(outputs)
                if self.stats_line.due:
                    logger.info("%s", self.stats_line.line(self.sched.stats()))
            else:
                self._send([])
                if not idle_checked:
                    self.sched.check_integrity()  # raises: a corrupt pool must not serve on
                    idle_checked = True
                    self._send_stats(idle_checked)
            if time.monotonic() - self._last_stats >= STATS_INTERVAL:
                self._send_stats(idle_checked)


def engine_main(
    plan: EnginePlan,
    sched_args: SchedulerArgs,
    afd: AfdArgs | None,
    addrs: Addresses,
    parent_pid: int,
    decode_log_interval: int,
) -> None:
    setup_child("engine")
    out = Sender(addrs.detokenizer)
    sched: RequestScheduler | None = None
    try:
        tokenizer = load_tokenizer(plan.model_path)
        sched = build_scheduler(plan, afd, lambda skip: IncrementalDetokenizer(tokenizer, skip), sched_args)
        EngineLoop(sched, Receiver(addrs.engine), out, parent_pid, decode_log_interval).run()
    except Exception as e:
        logger.exception("engine failed")
        out.send(EngineDead(f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from e
    finally:
        if sched is not None:
            sched.close()
