"""AFD behind the same HTTP server: `python -m minisgl serve --afd ...` answers the official openai
client with the colocated server's greedy tokens, streaming included, refuses what it cannot do
before any header, and frees everything after."""
from __future__ import annotations

import openai
import pytest

from server_harness import SERVER_FLAGS, running_server

PROMPTS = ["The quick brown fox", "Hello", "a b c d e f g h i j k l m n o p"]


def _completions(url: str) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt=PROMPTS, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    texts = [c.text for c in sorted(out.choices, key=lambda c: c.index)]
    assert out.usage.completion_tokens == 12 * len(PROMPTS)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, stream=True
    )
    texts.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    return texts


@pytest.fixture(scope="module")
def colocated_texts(tmp_path_factory) -> list[str]:
    with running_server(tmp_path_factory.mktemp("colo"), *SERVER_FLAGS, "--dtype", "float32") as server:
        return _completions(server.url)


def test_afd_server_matches_colocated(tmp_path, colocated_texts) -> None:
    flags = (*SERVER_FLAGS, "--dtype", "float32", "--afd", "--afd-attn-workers", "2", "--afd-expert-workers", "1",
             "--afd-num-mb", "2")
    with running_server(tmp_path, *flags) as server:
        assert _completions(server.url) == colocated_texts
        _logprobs_refused_before_headers(server)
        stats = server.wait_idle()
        assert stats["used_pages"] == 0 and stats["used_slots"] == 0


def _logprobs_refused_before_headers(server) -> None:
    """AFD has no logprobs yet: asked for, streaming or not, it is a 400 naming the field, never a
    200 whose stream then carries an error."""
    for body, param in [({"logprobs": 2}, "logprobs"), ({"prompt_logprobs": 1}, "prompt_logprobs")]:
        for stream in (False, True):
            r = server.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": stream, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True, "logprobs": True}
    r = server.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", r.text
