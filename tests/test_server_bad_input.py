"""Bad requests get a 400 (404 for an unknown model, as OpenAI and vLLM answer) with a message
that says what was wrong, and leave nothing behind in the pools."""
from __future__ import annotations

import openai
import pytest

from server_harness import Server

GOOD = {"prompt": "hi", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _expect(server: Server, path: str, status: int, match: str, **kw) -> None:
    r = server.post(path, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert match in err["message"], err
    assert err["code"] == status and err["type"]


@pytest.mark.parametrize(
    "body,match",
    [
        ({"max_tokens": 2}, "prompt: Field required"),
        ({**GOOD, "max_tokens": -1}, "max_tokens"),
        ({**GOOD, "max_tokens": 10**12}, "maximum context length is 256"),
        ({**GOOD, "max_tokens": "many"}, "max_tokens"),
        ({**GOOD, "temperature": -0.1}, "temperature"),
        ({**GOOD, "temperature": "hot"}, "temperature"),
        ({**GOOD, "top_p": 0}, "top_p"),
        ({**GOOD, "top_k": -5}, "top_k"),
        ({**GOOD, "n": 0}, "n:"),
        ({**GOOD, "n": 10**6}, "n:"),
        ({**GOOD, "prompt": ["a"] * 20, "n": 100}, "exceeds 1024 choices"),
        ({**GOOD, "logprobs": 99}, "logprobs"),
        ({**GOOD, "stop": [""]}, "stop strings"),
        ({**GOOD, "stop": 5}, "stop"),
        ({**GOOD, "prompt": ""}, "empty"),
        ({**GOOD, "prompt": []}, "empty"),
        ({**GOOD, "prompt": [1, "x"]}, "prompt"),
        ({**GOOD, "prompt": [10**9]}, "outside the vocabulary"),
        ({**GOOD, "prompt": "word " * 400}, "maximum context length is 256"),
        ({**GOOD, "frequency_penalty": 2.5}, "frequency_penalty"),
        ({**GOOD, "presence_penalty": -3}, "presence_penalty"),
        ({**GOOD, "repetition_penalty": 0}, "repetition_penalty"),
        ({**GOOD, "min_p": 1.5}, "min_p"),
        ({**GOOD, "min_tokens": 5}, "min_tokens"),
        ({**GOOD, "logit_bias": {"x": 1}}, "logit_bias"),
        ({**GOOD, "logit_bias": {"512": 1}}, "outside the vocabulary"),
        ({**GOOD, "suffix": "x"}, "suffix"),
    ],
)
def test_bad_completion(live_server: Server, body: dict, match: str) -> None:
    _expect(live_server, "/v1/completions", 400, match, json=body)


@pytest.mark.parametrize(
    "body,match",
    [
        ({"max_tokens": 2}, "messages: Field required"),
        ({**CHAT, "messages": []}, "at least one message"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
        ({**CHAT, "messages": [{"content": "x"}]}, "role: Field required"),
        ({**CHAT, "messages": "hi"}, "messages"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "only text parts"),
        ({**CHAT, "max_tokens": 0}, "at least 1"),
        ({**CHAT, "max_completion_tokens": 10**9}, "maximum context length"),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "--tool-call-parser"),
        ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_chat(live_server: Server, body: dict, match: str) -> None:
    _expect(live_server, "/v1/chat/completions", 400, match, json=body)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'{"prompt": "hi", "max_tokens": 2', b"\xff\xfe"])
def test_malformed_json(live_server: Server, raw: bytes) -> None:
    r = live_server.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"], r.text


def test_unknown_model_and_route(live_server: Server) -> None:
    _expect(live_server, "/v1/completions", 404, "does not exist", json={**GOOD, "model": "gpt-17"})
    _expect(live_server, "/v1/chat/completions", 404, "does not exist", json={**CHAT, "model": "gpt-17"})
    assert live_server.get("/v1/nope").status_code == 404
    assert live_server.get("/v1/completions").status_code == 405


def test_openai_client_raises_readable_errors(live_server: Server) -> None:
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="minisgl-tiny", prompt="hi", temperature=-1)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])


def test_nothing_leaks(live_server: Server) -> None:
    s = live_server.wait_idle()
    assert (s["used_pages"], s["used_slots"]) == (0, 0)
    assert live_server.get("/health").status_code == 200
