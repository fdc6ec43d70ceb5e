"""The API process's per-token path without a server: a handler's mailbox hands over everything
queued at once, the outputs that arrived together go out as one write of one SSE event each, an
error stops a batch after the outputs before it, and a chunk event's bytes are json.dumps' of the
whole chunk."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from minisgl.scheduler.messages import RequestOutput
from minisgl.server.engine_client import EngineUnavailable, Mailbox, Submission
from minisgl.server.errors import ApiError
from minisgl.server.metrics import ServerMetrics
from minisgl.server.request_log import RequestLog
from minisgl.server.serving import ChunkEvents, run_choices, sse_response


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _submission(rids: tuple[str, ...]) -> tuple[Submission, Mailbox]:
    box = Mailbox()
    return Submission(SimpleNamespace(_close=lambda request_id: 0), "req", rids, box), box  # type: ignore[arg-type]


async def _all(it: Any) -> list[Any]:
    return [x async for x in it]


def test_mailbox_wakes_its_waiter_and_hands_over_everything_queued() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        box = Mailbox()
        waiter = asyncio.ensure_future(box.take_all())
        await asyncio.sleep(0)  # the waiter is parked on its future
        box.put(RequestOutput("a", (1,)))
        box.put(RequestOutput("a", (2,)))  # before the waiter ran: it takes both
        first = await asyncio.wait_for(waiter, 5)
        box.put(RequestOutput("a", (3,)))
        return first, await box.take_all()

    first, second = asyncio.run(scenario())
    assert [o.new_token_ids for o in first] == [(1,), (2,)]
    assert [o.new_token_ids for o in second] == [(3,)]


def test_mailbox_put_after_its_waiter_was_cancelled() -> None:
    async def scenario() -> list[Any]:
        box = Mailbox()
        waiter = asyncio.ensure_future(box.take_all())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        box.put(RequestOutput("a", (1,)))  # no waiter left to wake: must not raise
        return await box.take_all()

    assert [o.new_token_ids for o in asyncio.run(scenario())] == [(1,)]


def test_batches_end_when_every_choice_finished() -> None:
    sub, box = _submission(("a", "b"))
    box.put(RequestOutput("a", (1,)))
    box.put(RequestOutput("b", (2,), finish_reason="stop"))

    async def scenario() -> list[list[RequestOutput]]:
        it = sub.batches()
        got = [await it.__anext__()]
        box.put(RequestOutput("a", (3,), finish_reason="length"))
        got += [b async for b in it]
        return got

    got = asyncio.run(scenario())
    assert [[o.new_token_ids for o in b] for b in got] == [[(1,), (2,)], [(3,)]]


def test_batches_give_the_outputs_before_an_engine_failure_then_raise_it() -> None:
    sub, box = _submission(("a",))
    box.put(RequestOutput("a", (1,)))
    box.put(EngineUnavailable("the engine process exited with code 1"))
    got: list[list[RequestOutput]] = []

    async def scenario() -> None:
        async for b in sub.batches():
            got.append(b)

    with pytest.raises(EngineUnavailable, match="exited with code 1"):
        asyncio.run(scenario())
    assert [[o.new_token_ids for o in b] for b in got] == [[(1,)]]


def test_chunk_event_is_the_whole_chunk_dumped() -> None:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m\u00e9\"\\"}
    choice = {"index": 0, "text": "caf\u00e9 \"q\" \\ \n\t\u2028\x01", "logprobs": None, "finish_reason": None,
              "stop_reason": None}
    assert ChunkEvents(head)(choice) == f"data: {_dumps({**head, 'choices': [choice]})}\n\n"
    with pytest.raises(ValueError, match="head"):
        ChunkEvents({})


def _ctx() -> SimpleNamespace:
    return SimpleNamespace(metrics=ServerMetrics("m"), request_log=RequestLog(enabled=False))


def test_outputs_queued_together_stream_as_one_write_of_one_event_each() -> None:
    sub, box = _submission(("a",))
    box.put(RequestOutput("a", (1,), text="x"))
    box.put(RequestOutput("a", (2,), text="y", finish_reason="length", num_output_tokens=2))
    closed: list[bool] = []
    event = ChunkEvents({"id": "c"})
    response = sse_response(run_choices(_ctx(), sub, lambda: closed.append(True)), lambda: None,  # type: ignore[arg-type]
                       lambda o: event({"text": o.text, "finish_reason": o.finish_reason}), None)
    writes = asyncio.run(_all(response.body_iterator))
    assert writes == [
        'data: {"id":"c","choices":[{"text":"x","finish_reason":null}]}\n\n'
        'data: {"id":"c","choices":[{"text":"y","finish_reason":"length"}]}\n\n',
        "data: [DONE]\n\n",
    ]
    assert closed == [True]


def test_a_rejected_choice_ends_the_stream_after_the_outputs_before_it() -> None:
    sub, box = _submission(("a", "b"))
    box.put(RequestOutput("a", (1,), text="x"))
    box.put(RequestOutput("b", finish_reason="abort", error="prompt too long"))
    box.put(RequestOutput("a", (2,), text="never"))
    event = ChunkEvents({"id": "c"})
    response = sse_response(run_choices(_ctx(), sub, lambda: None), lambda: None,  # type: ignore[arg-type]
                       lambda o: event({"text": o.text}), None)
    writes = asyncio.run(_all(response.body_iterator))
    assert writes[0] == 'data: {"id":"c","choices":[{"text":"x"}]}\n\n'
    assert json.loads(writes[1].removeprefix("data: "))["error"]["message"] == "prompt too long"
    assert writes[2:] == ["data: [DONE]\n\n"]


def test_a_rejected_first_output_raises_before_any_output() -> None:
    sub, box = _submission(("a",))
    box.put(RequestOutput("a", finish_reason="abort", error="bad"))

    async def scenario() -> list[Any]:
        return await _all(run_choices(_ctx(), sub, lambda: None))  # type: ignore[arg-type]

    with pytest.raises(ApiError, match="bad"):
        asyncio.run(scenario())
