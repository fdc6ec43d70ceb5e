"""ZMQ PUSH/PULL channels over IPC sockets carrying msgpack messages (messages.py).

Receivers bind and senders connect, so a process can restart or die without the other side's
socket going away. Sends never block: a peer that stopped reading is a dead peer, and blocking on
it would turn a crash into a hang.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from minisgl.server.messages import decode, encode


@dataclass(frozen=True)
class Addresses:
    engine: str  # API server -> engine
    detokenizer: str  # engine -> detokenizer
    api: str  # detokenizer -> API server

    @staticmethod
    def in_dir(path: str) -> "Addresses":
        return Addresses(*(f"ipc://{os.path.join(path, n)}" for n in ("engine", "detokenizer", "api")))


class PeerGone(RuntimeError):
    """The receiving side is not reading (or never connected)."""


_QUEUE_LIMIT = 100_000  # messages queued for a slow (or dead) receiver before send gives up
_LINGER_MS = 1000  # on exit, how long queued messages (a dying engine's last word) may take to leave


def _pull(ctx: zmq.Context, addr: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    return sock


class Sender:
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, _LINGER_MS)
        self.sock.setsockopt(zmq.SNDHWM, _QUEUE_LIMIT)
        self.sock.connect(addr)

    def send(self, msg: Any) -> None:
        self.send_encoded(encode(msg))

    def send_encoded(self, data: bytes) -> None:
        try:
            self.sock.send(data, flags=zmq.NOBLOCK)
        except zmq.Again as e:
            raise PeerGone(f"the receiver at {self.addr} is not reading") from e


class Receiver:
    def __init__(self, addr: str) -> None:
        self.sock = _pull(zmq.Context.instance(), addr)

    def recv_all(self, timeout_ms: int) -> list[Any]:
        """Every queued message, waiting up to timeout_ms for the first."""
        if not self.sock.poll(timeout_ms):
            return []
        msgs = []
        while True:
            try:
                msgs.append(decode(self.sock.recv(flags=zmq.NOBLOCK)))
            except zmq.Again:
                return msgs


class AsyncReceiver:
    def __init__(self, addr: str) -> None:
        self.sock = _pull(zmq.asyncio.Context.instance(), addr)

    async def recv(self) -> Any:
        return decode(await self.sock.recv())
