"""The API server's side of the engine: sends requests, routes text outputs back to the HTTP
handlers waiting for them, and turns a dead or hung engine into errors instead of hangs.

A watchdog checks every WATCHDOG_PERIOD that the children are alive and that the engine's heartbeat
(its stats, sent between steps) is fresh. When either fails, every waiting handler gets an
EngineUnavailable with the reason, and so does every later request; the children still running
are stopped, since the pipeline cannot serve without all of them (an engine whose detokenizer died
would otherwise keep running requests nobody can receive).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from multiprocessing.process import BaseProcess
from typing import Callable, Union

from minisgl.scheduler.messages import GenerateRequest, RequestOutput, SchedulerInfo, SchedulerStats
from minisgl.server.channel import Addresses, AsyncReceiver, PeerGone, Sender
from minisgl.server.messages import AbortRequest, EngineDead, EngineReady, EngineStats, FlushCache, TextBatch, encode

logger = logging.getLogger(__name__)

WATCHDOG_PERIOD = 0.25  # seconds
WAIT_SLICE = 1.0  # start()'s longest single wait before it re-checks the engine's health
LAST_WORD_GRACE = 1.0  # seconds an exited engine's EngineDead (its reason) may take to arrive


class EngineUnavailable(RuntimeError):
    """The engine process is gone or hung; str() says why."""


class RequestIdInUse(ValueError):
    """A response id must name one live request (it is what /abort_request aborts)."""


def _exit_reason(name: str, proc: BaseProcess) -> str:
    code = proc.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    return f"the {name} process {how}"


Item = Union[RequestOutput, EngineUnavailable]


class Mailbox:
    """One handler's outputs in arrival order. The receive loop puts without blocking; the handler
    takes everything queued at once, so one wake-up serves every output that arrived meanwhile
    (when it fell behind). A wait is one future, not wait_for's task and timer per call: a waiting
    handler needs no timeout, since the engine's failure reaches it as an item (_die)."""

    def __init__(self) -> None:
        self._items: list[Item] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Item) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():  # done: its waiter was cancelled
            self._waiter.set_result(None)

    async def take_all(self) -> list[Item]:
        """Everything queued (at least one item), waiting for the first."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class Submission:
    """The engine requests of one HTTP request (one per choice), registered under its response id."""

    def __init__(self, client: "EngineClient", request_id: str, rids: tuple[str, ...], mailbox: Mailbox) -> None:
        self.client, self.request_id, self.rids, self.mailbox = client, request_id, rids, mailbox

    async def batches(self) -> AsyncIterator[list[RequestOutput]]:
        """Every choice's outputs in arrival order, as the non-empty lists that were queued together,
        until each choice has finished."""
        left = set(self.rids)
        while left:
            items = await self.mailbox.take_all()
            for i, item in enumerate(items):
                if isinstance(item, EngineUnavailable):
                    if i:
                        yield items[:i]  # type: ignore[misc] (outputs only, before the error)
                    raise item
                if item.finished:
                    left.discard(item.rid)
            yield items  # type: ignore[misc] (outputs only)

    def close(self) -> int:
        """The handler is done (finished, failed, or its client left): forget the request and abort
        whichever choices still run. Returns how many were aborted; closing twice aborts nothing."""
        return self.client._close(self.request_id)


class EngineClient:
    def __init__(
        self,
        addrs: Addresses,
        procs: dict[str, BaseProcess],
        watchdog_timeout: float,
        on_stats: Callable[[SchedulerStats], None] = lambda s: None,
        on_dead: Callable[[], None] = lambda: None,
    ) -> None:
        self._sender = Sender(addrs.engine)
        self._receiver = AsyncReceiver(addrs.api)
        self._procs = procs
        self._watchdog_timeout = watchdog_timeout
        self._on_stats = on_stats
        self._on_dead = on_dead
        self._routes: dict[str, Mailbox] = {}  # rid -> its handler's mailbox, until the rid finishes
        self._requests: dict[str, tuple[str, ...]] = {}  # response id -> its rids, until its handler closes it
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

    @property
    def detokenizer_pid(self) -> int | None:
        return self._procs["detokenizer"].pid

    def check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineUnavailable(self.dead_reason)
        if not self._ready.is_set():
            raise EngineUnavailable("the engine is still starting")

    # -- requests -------------------------------------------------------------------------------
    @property
    def num_in_flight(self) -> int:
        """Engine requests sent and not yet finished (running or waiting in the engine)."""
        return len(self._routes)

    def submit(self, request_id: str, reqs: list[GenerateRequest]) -> Submission:
        """Send reqs (all or none) under request_id."""
        self.check_alive()
        if request_id in self._requests:
            raise RequestIdInUse(f"request id {request_id!r} is already in use")
        # Everything is encoded before anything is registered, so a request that cannot be sent
        # leaves nothing behind.
        payloads = [encode(r) for r in reqs]
        box = Mailbox()
        rids = tuple(r.rid for r in reqs)
        self._requests[request_id] = rids
        for rid in rids:
            self._routes[rid] = box
        try:
            for data in payloads:
                self._sender.send_encoded(data)
        except PeerGone as e:
            self._requests.pop(request_id)
            self._die(str(e))
            raise EngineUnavailable(self.dead_reason) from e
        return Submission(self, request_id, rids, box)

    def abort_request_id(self, request_id: str) -> int:
        """Abort the still-running choices of the response with exactly this id; returns how many.
        Their routes stay, so each handler receives its final output (finish_reason "abort") and
        replies with what it has."""
        running = [rid for rid in self._requests.get(request_id, ()) if rid in self._routes]
        self._send_aborts(running)
        return len(running)

    def flush_cache(self) -> None:
        """Ask the engine to drop its cached prompt prefixes; requests submitted after this call
        reach it after the flush (one socket, in order)."""
        self.check_alive()
        try:
            self._sender.send(FlushCache())
        except PeerGone as e:
            self._die(str(e))
            raise EngineUnavailable(self.dead_reason) from e

    def _close(self, request_id: str) -> int:
        running = [rid for rid in self._requests.pop(request_id, ()) if self._routes.pop(rid, None) is not None]
        self._send_aborts(running)
        return len(running)

    def _send_aborts(self, rids: list[str]) -> None:
        for rid in rids:
            if self.dead_reason is not None:
                return
            try:
                self._sender.send(AbortRequest(rid))
            except PeerGone as e:
                self._die(str(e))

    # -- background -----------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            msg = await self._receiver.recv()
            if isinstance(msg, TextBatch):
                for o in msg.outputs:
                    box = self._routes.pop(o.rid, None) if o.finished else self._routes.get(o.rid)
                    if box is not None:
                        box.put(o)
            elif isinstance(msg, EngineStats):
                if self.dead_reason is not None:
                    continue  # a dead engine's last stats would show requests no longer running
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
            gone = [(name, proc) for name, proc in self._procs.items() if not proc.is_alive()]
            if gone:
                # An engine that failed on an error sent why on its way out; let that reason arrive.
                await asyncio.sleep(LAST_WORD_GRACE)
                for name, proc in gone:
                    self._die(_exit_reason(name, proc))
                continue
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
        for box in {id(b): b for b in self._routes.values()}.values():
            box.put(err)
        self._routes.clear()
        self.stats, self.idle_checked = None, False  # nothing is running any more
        self._on_dead()
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()
