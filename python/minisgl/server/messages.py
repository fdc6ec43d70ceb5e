"""The messages between the server's processes, and their msgpack codec.

    API server --GenerateRequest, AbortRequest, FlushCache--> engine
    engine --TokenBatch, EngineReady, EngineStats, EngineDead--> detokenizer
    detokenizer --TextBatch (and the engine's other messages, unchanged)--> API server

Every message is a frozen dataclass registered here; the codec packs a dataclass as a msgpack
extension holding its class name and its fields in order, so nesting (a TokenBatch of
RequestOutputs of TokenLogprobs) round-trips with its types, and nothing is unpickled.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack

from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest, RequestOutput, SchedulerInfo, SchedulerStats, TokenLogprob


@dataclass(frozen=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True)
class FlushCache:
    """Drop the cached prompt prefixes (requests sent after it find none)."""


@dataclass(frozen=True)
class DetokSpec:
    """How the detokenizer renders one request's text."""

    skip_special_tokens: bool
    stop: tuple[str, ...]
    min_tokens: int = 0  # stop strings may not end in these first tokens' text


@dataclass(frozen=True)
class TokenBatch:
    outputs: tuple[RequestOutput, ...]
    specs: tuple[tuple[str, DetokSpec], ...] = ()  # for rids whose first output is in this batch


@dataclass(frozen=True)
class TextBatch:
    outputs: tuple[RequestOutput, ...]  # with `text` filled in


@dataclass(frozen=True)
class EngineReady:
    info: SchedulerInfo
    pid: int


@dataclass(frozen=True)
class EngineStats:
    stats: SchedulerStats
    idle_checked: bool  # idle, and the integrity check has passed since the last step


@dataclass(frozen=True)
class EngineDead:
    """The engine's last word before exiting on an error."""

    reason: str


_EXT = 1
_TYPES: dict[str, type] = {
    t.__name__: t
    for t in (
        SamplingParams, GenerateRequest, TokenLogprob, RequestOutput, SchedulerInfo, SchedulerStats,
        AbortRequest, FlushCache, DetokSpec, TokenBatch, TextBatch, EngineReady, EngineStats, EngineDead,
    )
}


def _default(obj: Any) -> msgpack.ExtType:
    name = type(obj).__name__
    if _TYPES.get(name) is not type(obj):
        raise TypeError(f"cannot send a {type(obj).__qualname__}: not a registered message type")
    values = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    return msgpack.ExtType(_EXT, msgpack.packb([name, *values], default=_default))


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _EXT:
        raise ValueError(f"unknown msgpack extension {code}")
    name, *values = msgpack.unpackb(data, ext_hook=_ext_hook, use_list=False)
    return _TYPES[name](*values)


def encode(msg: Any) -> bytes:
    return msgpack.packb(msg, default=_default)


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, use_list=False)
