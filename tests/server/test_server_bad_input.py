"""Bad requests get a 400 (404 for an unknown model, as OpenAI and vLLM answer) with a message
that says what was wrong, and leave nothing behind in the pools."""
from __future__ import annotations

import json

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
        ({**GOOD, "stop": [""]}, "stop[0]: String should have at least 1 character"),
        ({**GOOD, "echo": 0}, "echo: Input should be a valid boolean"),
        ({**GOOD, "max_tokens": "5"}, "max_tokens: Input should be a valid integer"),
        ({**GOOD, "max_tokens": 2.5}, "max_tokens: Input should be a valid integer"),
        ({**GOOD, "stop": 5}, "stop"),
        ({**GOOD, "prompt": ""}, "prompt: String should have at least 1 character"),
        ({**GOOD, "prompt": []}, "prompt: List should have at least 1 item"),
        ({**GOOD, "prompt": [[1], []]}, "prompt[1]: List should have at least 1 item"),
        ({**GOOD, "prompt": [1, "x"]}, "prompt"),
        ({**GOOD, "prompt": [-1]}, "prompt[0]: Input should be greater than or equal to 0"),
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
        ({**CHAT, "messages": []}, "messages: List should have at least 1 item"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "role must be one of"),
        ({**CHAT, "messages": [{"content": "x"}]}, "role: Field required"),
        ({**CHAT, "messages": "hi"}, "messages"),
        ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "only text parts"),
        ({**CHAT, "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({**CHAT, "max_completion_tokens": 10**9}, "maximum context length"),
        ({**CHAT, "top_logprobs": 2}, "top_logprobs needs logprobs"),
        ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "--tool-call-parser"),
        ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_chat(live_server: Server, body: dict, match: str) -> None:
    _expect(live_server, "/v1/chat/completions", 400, match, json=body)


# Values JSON can carry but no engine can hold: a 400 naming the field, never a 500.
@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {**GOOD, "seed": 2**64}, "seed"),
        ("/v1/completions", {**GOOD, "seed": -(2**70)}, "seed"),
        ("/v1/completions", {**GOOD, "stop_token_ids": [3, 2**70]}, "stop_token_ids"),
        ("/v1/completions", {**GOOD, "prompt": [5, 2**64]}, "prompt"),
        ("/v1/completions", {**GOOD, "top_k": 2**65}, "top_k"),
        ("/v1/completions", {**GOOD, "prompt": "hi \ud800 there"}, "prompt"),
        ("/v1/completions", {**GOOD, "prompt": ["ok", "\udc00"]}, "prompt"),
        ("/v1/completions", {**GOOD, "stop": ["\ud800"]}, "stop"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a\udfffb"}]}, "messages"),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "a", "name": "\ud800"}]},
         "messages"),
        ("/v1/chat/completions", {**CHAT, "seed": 2**64, "n": 1}, "seed"),
    ],
)
def test_values_beyond_the_engine(live_server: Server, path: str, body: dict, param: str) -> None:
    # ASCII JSON carries a lone surrogate as a \uXXXX escape, which JSON allows.
    r = live_server.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param), err


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
