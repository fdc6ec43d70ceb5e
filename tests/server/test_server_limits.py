"""A server with every limit set low, and an API key:

- --api-key guards /v1/* and the admin routes, before any body is read; /health and /metrics stay open;
- --max-request-body-bytes: a larger body is a 413, at once when its Content-Length says so;
- --body-read-timeout: a client that does not send the body it announced gets a 408 and is cut off;
- --max-logprob-entries: a request that may produce more logprob entries is a 400 naming the field;
- --max-queued-requests: beyond it a 503 with Retry-After, before any header of a stream;
- --timeout-keep-alive: an idle kept-alive connection is closed after it, not before;
- a non-streaming chat whose client leaves while it waits for its first token leaves no traceback."""
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from server_harness import SERVER_FLAGS, Server, running_server

KEY = "test-key-0123"
LIMIT_FLAGS = ("--max-running-requests", "2", "--max-queued-requests", "2", "--max-request-body-bytes", "4096",
               "--body-read-timeout", "1", "--max-logprob-entries", "1000", "--timeout-keep-alive", "2")
LONG = {"prompt": "The quick brown fox", "max_tokens": 240, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, _isolated_cache: None) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("limits"), *SERVER_FLAGS, *LIMIT_FLAGS, api_key=KEY) as s:
        yield s


def _raw(server: Server, request: bytes, pause_after_s: float = 0.0) -> tuple[bytes, float]:
    """Send raw bytes, then read the whole answer until the server closes; (answer, seconds)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        start = time.monotonic()
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer, time.monotonic() - start


def test_idle_connection_closes_after_the_keep_alive_timeout(server: Server) -> None:
    answer, seconds = _raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert 1.5 < seconds < 4.5, f"closed after {seconds:.1f} s, expected the 2 s asked for (uvicorn: 5 s)"


def test_api_key_guards_v1_and_admin_routes(server: Server) -> None:
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("POST", "/abort_request"), ("GET", "/server_info")]:
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, server.url + path, headers=auth, content=b"{not json", timeout=10)
            assert r.status_code == 401, (method, path, auth, r.text)  # before the body is even parsed
            assert r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["error"]["message"]
    for path in ("/health", "/metrics"):
        assert httpx.get(server.url + path, timeout=10).status_code == 200
    assert server.get("/server_info").status_code == 200
    ok = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    assert ok.completions.create(model="minisgl-tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()


def test_request_body_size_limit(server: Server) -> None:
    r = server.post("/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 1})
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"], r.text
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n").encode()
    answer, took = _raw(server, head)  # announced, never sent: refused without reading it
    assert answer.startswith(b"HTTP/1.1 413") and took < 1.0, (answer[:200], took)


def test_slow_body_gets_408_and_is_cut_off(server: Server) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    answer, took = _raw(server, head + b'{"prompt":')  # 10 of the 100 bytes, then silence
    assert answer.startswith(b"HTTP/1.1 408") and b"--body-read-timeout" in answer, answer[:300]
    assert 0.9 < took < 5.0, took  # the server closed the connection soon after its 1 s limit


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "hi", "max_tokens": 100, "logprobs": 20}, "logprobs"),  # 21 x 100 entries
        ({"prompt": list(range(3, 63)), "max_tokens": 1, "prompt_logprobs": 20}, "prompt_logprobs"),  # 21 x 59
        ({"prompt": "hi", "max_tokens": 40, "logprobs": 5, "n": 5}, "logprobs"),  # 5 x 6 x 40
    ],
)
def test_logprob_entry_cap(server: Server, body: dict, param: str) -> None:
    r = server.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "--max-logprob-entries" in r.json()["error"]["message"]


def test_logprobs_within_the_cap(server: Server) -> None:
    r = server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8, "logprobs": 5, "n": 2})
    assert r.status_code == 200 and len(r.json()["choices"][1]["logprobs"]["top_logprobs"]) == 8, r.text


async def _fill_and_overflow(server: Server) -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
    """2 running + 2 waiting fill the server; a fifth stream is refused before its headers."""
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60) as client:
        ids = [f"fill-{i}" for i in range(4)]
        tasks = [asyncio.ensure_future(client.post("/v1/completions", json={**LONG, "stream": False},
                                                   headers={"X-Request-Id": rid})) for rid in ids]
        while (await client.get("/server_info")).json()["requests_in_flight"] < 4:
            await asyncio.sleep(0.05)
        over = await client.post("/v1/completions", json=LONG)
        never = await client.post("/v1/completions", json={**LONG, "n": 5})
        for rid in ids:
            await client.post("/abort_request", json={"rid": rid})
        return list(await asyncio.gather(*tasks)), over, never


def test_waiting_queue_limit(server: Server) -> None:
    filled, over, never = asyncio.run(_fill_and_overflow(server))
    assert over.status_code == 503 and over.headers["retry-after"] == "1", over.text
    assert "--max-queued-requests" in over.json()["error"]["message"]
    assert never.status_code == 400 and never.json()["error"]["param"] == "n", never.text
    assert all(r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "abort" for r in filled)
    stats = server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"]) == (0, 0)


async def _chat_client_leaves_while_queued(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60) as client:
        ids = ["busy-0", "busy-1"]
        busy = [asyncio.ensure_future(client.post("/v1/completions", json={**LONG, "stream": False},
                                                  headers={"X-Request-Id": rid})) for rid in ids]
        while (await client.get("/server_info")).json()["requests_in_flight"] < 2:
            await asyncio.sleep(0.05)
        chat = asyncio.ensure_future(client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        await asyncio.sleep(0.3)
        chat.cancel()  # the connection closes before the queued chat saw a token
        for rid in ids:
            await client.post("/abort_request", json={"rid": rid})
        await asyncio.gather(*busy)


def test_chat_client_leaving_before_first_token_leaves_no_traceback(server: Server) -> None:
    asyncio.run(_chat_client_leaves_while_queued(server))
    stats = server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"]) == (0, 0)
    assert server.get("/server_info").json()["requests_in_flight"] == 0
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log and "KeyError" not in log, server.log_tail()
