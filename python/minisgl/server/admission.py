"""The one path every generation request takes before the engine sees it. Everything is checked
before anything is registered, and a request is sent whole or not at all:

- every value must be one the engine can hold (integers within 64 bits, strings without lone
  UTF-16 surrogates);
- the engine must support what is asked (the AFD coordinator has no logprobs yet);
- the logprob entries the request may produce stay within --max-logprob-entries;
- the waiting queue stays within --max-queued-requests (503 with Retry-After beyond it).

What fails is a 400 naming the field, or a 503 when the server is full or the engine is gone;
nothing fails after the response headers went out except the engine itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from minisgl.scheduler.messages import GenerateRequest
from minisgl.server.engine_client import EngineClient, EngineUnavailable, RequestIdInUse, Submission
from minisgl.server.errors import ApiError

# What msgpack carries and a torch generator takes as a seed: int64 and uint64 together.
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
RETRY_AFTER_S = 1
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_LEN = 128


def unholdable(value: Any, path: str, ints: bool = True) -> tuple[str, str] | None:
    """(where, why) for the first value nested in `value` that cannot cross to the engine: a string
    with a lone UTF-16 surrogate or, with `ints`, an integer beyond 64 bits (JSON allows both)."""
    if ints and isinstance(value, int) and not isinstance(value, bool):
        return None if INT_MIN <= value <= INT_MAX else (path, f"{value} does not fit in 64 bits")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return path, f"holds a lone UTF-16 surrogate ({value[e.start]!r}) at character {e.start}"
        return None
    if isinstance(value, BaseModel):  # its fields, and the extra fields it keeps
        pairs: Any = iter(value)
    elif dataclasses.is_dataclass(value):
        pairs = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, Mapping):
        pairs = value.items()
    elif isinstance(value, Sequence):
        # Token ids in bulk (type() is exact: a bool is not a token id): a per-element walk costs
        # milliseconds on a long prompt, on the one event loop that streams every response.
        if value and set(map(type, value)) == {int} and (not ints or INT_MIN <= min(value) and max(value) <= INT_MAX):
            return None
        return next(filter(None, (unholdable(v, f"{path}[{i}]", ints) for i, v in enumerate(value))), None)
    else:
        return None
    for key, v in pairs:
        shown = str(key).encode("utf-8", "backslashreplace").decode()  # the message itself must be sendable
        where = f"{path}.{shown}" if path else shown
        bad = unholdable(key, f"{where} (the key)") if isinstance(key, str) else None
        bad = bad or unholdable(v, where, ints)
        if bad is not None:
            return bad
    return None


def _top_field(path: str) -> str:
    return path.replace("[", ".").replace(" ", ".").split(".")[0]


def check_text(body: BaseModel) -> None:
    """400 naming the field for the first string of a request body that is not Unicode text: any of
    them may reach the tokenizer. (Integers matter only where they cross to the engine; admit()
    checks those, derived values included.)"""
    bad = unholdable(body, "", ints=False)
    if bad is not None:
        raise ApiError(400, f"{bad[0]}: {bad[1]}", _top_field(bad[0]))


def response_id(raw: Request, default: str) -> str:
    """The client's X-Request-Id when it sent one (so that it can abort a non-streaming request by
    it), else `default`."""
    given = raw.headers.get(REQUEST_ID_HEADER)
    if given is None:
        return default
    if not 0 < len(given) <= MAX_REQUEST_ID_LEN or not given.isascii() or not given.isprintable():
        raise ApiError(400, f"X-Request-Id must be 1 to {MAX_REQUEST_ID_LEN} printable ASCII characters",
                       "X-Request-Id")
    return given


def logprob_entries(req: GenerateRequest) -> int:
    """Logprob entries (a token's own plus its alternatives) the request may produce at most."""
    p = req.params
    out = 0
    if p.logprobs is not None:
        out += (p.logprobs + 1) * p.max_tokens
    if p.prompt_logprobs is not None:
        out += (p.prompt_logprobs + 1) * (len(req.prompt_ids) - 1)
    return out


class Admission:
    def __init__(self, client: EngineClient, max_queued_requests: int | None, max_logprob_entries: int) -> None:
        self.client = client
        self.max_queued = max_queued_requests
        self.max_logprob_entries = max_logprob_entries

    def admit(self, request_id: str, reqs: list[GenerateRequest]) -> Submission:
        """Check reqs (see the module doc) and submit them together, or raise ApiError."""
        try:
            self.client.check_alive()
        except EngineUnavailable as e:
            raise ApiError(503, str(e)) from None
        info = self.client.info
        assert info is not None
        for r in reqs:
            bad = unholdable(r.params, "") or unholdable(r.prompt_ids, "prompt")
            if bad is not None:  # a derived value, e.g. the seed of choice j (seed + j)
                raise ApiError(400, f"{bad[0]}: {bad[1]}", _top_field(bad[0]))
            if not info.supports_logprobs and (r.params.logprobs is not None or r.params.prompt_logprobs is not None):
                raise ApiError(400, f"logprobs and prompt_logprobs are not supported on this engine ({info.device})",
                               "logprobs" if r.params.logprobs is not None else "prompt_logprobs")
        entries = sum(map(logprob_entries, reqs))
        if entries > self.max_logprob_entries:
            field = "logprobs" if any(r.params.logprobs is not None for r in reqs) else "prompt_logprobs"
            raise ApiError(400, f"this request may produce {entries} logprob entries ({len(reqs)} choices); the limit "
                                f"is {self.max_logprob_entries} (--max-logprob-entries): lower n, max_tokens, logprobs or "
                                f"prompt_logprobs", field)
        self._check_queue(len(reqs), info.max_running_requests)
        try:
            return self.client.submit(request_id, reqs)
        except RequestIdInUse as e:
            raise ApiError(400, str(e), "X-Request-Id") from None
        except EngineUnavailable as e:
            raise ApiError(503, str(e)) from None

    def _check_queue(self, new: int, running_slots: int) -> None:
        if self.max_queued is None:
            return
        if new > running_slots + self.max_queued:
            raise ApiError(400, f"{new} choices can never be admitted: the engine runs {running_slots} at once and "
                                f"queues at most {self.max_queued} (--max-queued-requests)", "n")
        waiting = max(0, self.client.num_in_flight + new - running_slots)
        if waiting > self.max_queued:
            raise ApiError(503, f"the server is at capacity: {self.client.num_in_flight} requests are in the engine "
                                f"and at most {self.max_queued} may wait (--max-queued-requests); retry later",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
