"""The API server's side of the engine: sends requests, routes text outputs back to the HTTP
handlers waiting for them, and turns a dead or hung engine into errors instead of hangs.

A watchdog checks every WATCHDOG_PERIOD that the children are alive and that the engine's heartbeat
(its stats, sent between steps) is fresh. When either fails, every waiting handler gets an
EngineUnavailable with the reason, and so does every later request.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from multiprocessing.process import BaseProcess
from typing import Callable

from minisgl.scheduler.io import GenerateRequest, RequestOutput, SchedulerInfo, SchedulerStats
from minisgl.server.channel import Addresses, AsyncReceiver, PeerGone, Sender
from minisgl.server.messages import AbortRequest, EngineDead, EngineReady, EngineStats, TextBatch

logger = logging.getLogger(__name__)

WATCHDOG_PERIOD = 0.25  # seconds
WAIT_SLICE = 1.0  # a handler's longest single wait before it re-checks the engine's health


class EngineUnavailable(RuntimeError):
    """The engine process is gone or hung; str() says why."""


def _exit_reason(name: str, proc: BaseProcess) -> str:
    code = proc.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    return f"the {name} process {how}"


class EngineClient:
    def __init__(
        self,
        addrs: Addresses,
        procs: dict[str, BaseProcess],
        watchdog_timeout: float,
        on_stats: Callable[[SchedulerStats], None] = lambda s: None,
    ) -> None:
        self._sender = Sender(addrs.engine)
        self._receiver = AsyncReceiver(addrs.api)
        self._procs = procs
        self._watchdog_timeout = watchdog_timeout
        self._on_stats = on_stats
        self._routes: dict[str, asyncio.Queue[RequestOutput | EngineUnavailable]] = {}
        self._ready = asyncio.Event()
        self._heartbeat = time.monotonic()
        self._tasks: list[asyncio.Task] = []
        self.info: SchedulerInfo | None = None
        self.engine_pid: int | None = None
        self.stats: SchedulerStats | None = None
        self.idle_checked = False  # the engine is idle and its pools passed the check since its last step
        self.dead_reason: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, startup_timeout: float) -> SchedulerInfo:
        self._tasks = [asyncio.create_task(self._recv_loop()), asyncio.create_task(self._watchdog())]
        deadline = time.monotonic() + startup_timeout
        while not self._ready.is_set():
            if self.dead_reason is not None:
                raise EngineUnavailable(f"the engine failed to start: {self.dead_reason}")
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"the engine did not start within {startup_timeout:.0f} s")
            try:
                await asyncio.wait_for(self._ready.wait(), WAIT_SLICE)
            except asyncio.TimeoutError:  # (not the builtin before Python 3.11)
                pass
        assert self.info is not None
        return self.info

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineUnavailable(self.dead_reason)
        if not self._ready.is_set():
            raise EngineUnavailable("the engine is still starting")

    # -- requests -------------------------------------------------------------------------------
    def submit(self, reqs: list[GenerateRequest]) -> asyncio.Queue[RequestOutput | EngineUnavailable]:
        """Send reqs; their outputs (all of them) arrive on the returned queue."""
        self.check_alive()
        q: asyncio.Queue[RequestOutput | EngineUnavailable] = asyncio.Queue()
        try:
            for r in reqs:
                self._routes[r.rid] = q
                self._sender.send(r)
        except PeerGone as e:
            self._die(str(e))
            raise EngineUnavailable(self.dead_reason) from e
        return q

    def abort(self, rids: list[str]) -> int:
        """Abort whichever of rids are still running (dropping their routes at once); returns how many."""
        running = [rid for rid in rids if self._routes.pop(rid, None) is not None]
        for rid in running:
            if self.dead_reason is None:
                try:
                    self._sender.send(AbortRequest(rid))
                except PeerGone as e:
                    self._die(str(e))
        return len(running)

    def abort_request_id(self, request_id: str) -> int:
        """Abort a response id's choices (rids "<id>-<i>"), or one rid; returns how many were running."""
        return self.abort([rid for rid in self._routes if rid == request_id or rid.startswith(request_id + "-")])

    async def outputs(
        self, q: asyncio.Queue[RequestOutput | EngineUnavailable], rids: list[str]
    ) -> AsyncIterator[RequestOutput]:
        """Outputs for rids, as they come, until each has finished."""
        left = set(rids)
        while left:
            try:
                item = await asyncio.wait_for(q.get(), WAIT_SLICE)
            except asyncio.TimeoutError:  # (not the builtin before Python 3.11)
                self.check_alive()
                continue
            if isinstance(item, EngineUnavailable):
                raise item
            if item.finished:
                left.discard(item.rid)
            yield item

    # -- background -----------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            msg = await self._receiver.recv()
            if isinstance(msg, TextBatch):
                for o in msg.outputs:
                    q = self._routes.pop(o.rid, None) if o.finished else self._routes.get(o.rid)
                    if q is not None:
                        q.put_nowait(o)
            elif isinstance(msg, EngineStats):
                self.stats, self.idle_checked, self._heartbeat = msg.stats, msg.idle_checked, time.monotonic()
                self._on_stats(msg.stats)
            elif isinstance(msg, EngineReady):
                self.info, self.engine_pid, self._heartbeat = msg.info, msg.pid, time.monotonic()
                self._ready.set()
            elif isinstance(msg, EngineDead):
                self._die(f"the engine failed: {msg.reason}")
            else:
                logger.error("ignoring an unexpected message: %s", type(msg).__name__)

    async def _watchdog(self) -> None:
        while self.dead_reason is None:
            await asyncio.sleep(WATCHDOG_PERIOD)
            for name, proc in self._procs.items():
                if not proc.is_alive():
                    self._die(_exit_reason(name, proc))
            stale = time.monotonic() - self._heartbeat
            if self._ready.is_set() and stale > self._watchdog_timeout:
                self._die(f"the engine made no progress for {stale:.0f} s (--watchdog-timeout); it was stopped")
                self._procs["engine"].kill()

    def _die(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        logger.error("engine unavailable: %s", reason)
        err = EngineUnavailable(reason)
        for q in {id(q): q for q in self._routes.values()}.values():
            q.put_nowait(err)
        self._routes.clear()
