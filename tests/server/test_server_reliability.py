"""Abort semantics, atomic submission and schema conformance of the live server, through HTTP:

- an aborted request still gets its reply: finish_reason "abort" and what it produced so far
  (streaming: a final chunk, usage and [DONE]);
- /abort_request matches response ids exactly, never by prefix;
- a request that cannot cross to the engine is refused whole, leaving nothing registered;
- 405s carry Allow, /health answers JSON and /metrics text/plain, as the schema says."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from server_harness import Server

LONG = {"prompt": "The quick brown fox", "max_tokens": 240, "ignore_eos": True, "temperature": 0}
REPLY_TIMEOUT = 20.0  # an aborted request's reply comes within a step or two; this only bounds a failure


async def _stream_then_abort(client: httpx.AsyncClient, abort_with: str | None) -> tuple[list[dict], list[str]]:
    """Stream LONG; after the first chunk, abort it by its id (or by abort_with). Returns the chunks
    and the raw event lines after the abort."""
    chunks: list[dict] = []
    after: list[str] = []
    body = {**LONG, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if chunks:
                after.append(line)
            if line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
            if len(chunks) == 1 and not after:
                a = await client.post("/abort_request", json={"rid": abort_with or chunks[0]["id"]})
                assert a.status_code == 200 and a.json()["aborted"] == (0 if abort_with else 1), a.text
    return chunks, after


def test_aborted_stream_ends_with_abort_and_done(live_server: Server) -> None:
    async def run() -> tuple[list[dict], list[str]]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=REPLY_TIMEOUT) as client:
            return await _stream_then_abort(client, None)

    chunks, after = asyncio.run(run())
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "abort" and finishes.count("abort") == 1, finishes
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and 0 < usage["completion_tokens"] < LONG["max_tokens"], usage
    assert after[-1] == "data: [DONE]"


def test_aborted_non_streaming_request_replies_with_what_it_has(live_server: Server) -> None:
    """The client names its request (X-Request-Id), so it can abort a non-streaming one."""

    async def run() -> tuple[httpx.Response, dict]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=REPLY_TIMEOUT) as client:
            task = asyncio.ensure_future(client.post("/v1/completions", json=LONG, headers={"X-Request-Id": "mine-7"}))
            while live_server.get("/server_info").json()["requests_in_flight"] == 0:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # a few tokens in
            aborted = (await client.post("/abort_request", json={"rid": "mine-7"})).json()
            return await task, aborted

    r, aborted = asyncio.run(run())
    assert aborted == {"aborted": 1}
    assert r.status_code == 200, r.text
    data = r.json()
    choice = data["choices"][0]
    assert data["id"] == "mine-7" and choice["finish_reason"] == "abort"
    assert 0 < data["usage"]["completion_tokens"] < LONG["max_tokens"] and choice["text"]


def test_abort_matches_exact_ids_only(live_server: Server) -> None:
    """A prefix of every completion id ("cmpl") aborts nothing; the stream runs to its length."""

    async def run() -> tuple[list[dict], list[str]]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as client:
            return await _stream_then_abort(client, "cmpl")

    chunks, _ = asyncio.run(run())
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and chunks[-1]["usage"]["completion_tokens"] == LONG["max_tokens"]


def test_request_id_in_use_is_refused(live_server: Server) -> None:
    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=REPLY_TIMEOUT) as client:
            first = asyncio.ensure_future(client.post("/v1/completions", json=LONG, headers={"X-Request-Id": "twin"}))
            while live_server.get("/server_info").json()["requests_in_flight"] == 0:
                await asyncio.sleep(0.02)
            second = await client.post("/v1/completions", json=LONG, headers={"X-Request-Id": "twin"})
            await client.post("/abort_request", json={"rid": "twin"})
            return await first, second

    first, second = asyncio.run(run())
    assert first.status_code == 200 and first.json()["choices"][0]["finish_reason"] == "abort"
    assert second.status_code == 400 and second.json()["error"]["param"] == "X-Request-Id", second.text


@pytest.mark.parametrize("stream", [False, True])
def test_submission_is_atomic(live_server: Server, stream: bool) -> None:
    """The second choice's seed (seed + 1) does not fit in 64 bits: the whole request is a 400 before
    any header, and no choice of it runs or stays registered."""
    body = {**LONG, "n": 2, "seed": 2**64 - 1, "temperature": 1.0, "stream": stream}
    r = live_server.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed" and "64 bits" in r.json()["error"]["message"]
    assert live_server.get("/server_info").json()["requests_in_flight"] == 0
    stats = live_server.wait_idle()
    assert (stats["num_running"], stats["num_waiting"], stats["used_slots"]) == (0, 0, 0)


def test_openai_client_sees_abort(live_server: Server) -> None:
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=REPLY_TIMEOUT)
    stream = client.chat.completions.create(model="minisgl-tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=200, stream=True, extra_body={"ignore_eos": True})
    finishes = []
    for chunk in stream:
        if len(finishes) == 0:
            assert live_server.post("/abort_request", json={"rid": chunk.id}).json() == {"aborted": 1}
        finishes.append(chunk.choices[0].finish_reason)
    assert finishes[-1] == "abort" and len(finishes) < 200


def test_wrong_method_is_405_with_allow(live_server: Server) -> None:
    for method, path, allow in [("PUT", "/v1/completions", "POST"), ("DELETE", "/health", "GET")]:
        r = httpx.request(method, live_server.url + path, timeout=10)
        assert r.status_code == 405 and allow in r.headers["allow"], (method, path, r.headers)
        assert r.json()["error"]["code"] == 405


def test_health_and_metrics_content_types(live_server: Server) -> None:
    health = live_server.get("/health")
    assert health.headers["content-type"] == "application/json" and health.json() == {"status": "ok"}
    assert live_server.get("/metrics").headers["content-type"].startswith("text/plain")
    schema = live_server.get("/openapi.json").json()
    paths = schema["paths"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in paths["/v1/completions"]["post"]["responses"]["200"]["content"]
    props = schema["components"]["schemas"]
    assert props["ChatCompletionRequest"]["properties"]["messages"]["minItems"] == 1
    prompt_forms = props["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert all(f.get("minLength") == 1 or f.get("minItems") == 1 for f in prompt_forms), prompt_forms
