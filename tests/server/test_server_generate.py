"""SGLang's native POST /generate against the live server: the shapes SGLang's clients and its
bench_serving (`--backend sglang`) read, the same tokens as /v1/completions, and bad input."""
from __future__ import annotations

import json

import httpx
import pytest

from server_harness import Server

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def _post(server: Server, body: dict) -> httpx.Response:
    return server.post("/generate", json=body)


def _completion(server: Server, **kw) -> dict:
    r = server.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                             "logprobs": 2, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_one_prompt_matches_the_completions_route(live_server: Server) -> None:
    r = _post(live_server, {"text": PROMPT, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    out = r.json()
    want = _completion(live_server)
    assert out["text"] == want["text"] and len(out["output_ids"]) == 8
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["completion_tokens"] == 8 and meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert meta["id"] and meta["cached_tokens"] == 0
    assert "output_token_logprobs" not in meta and "index" not in out
    ids = live_server.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    by_ids = _post(live_server, {"input_ids": ids, "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == out["output_ids"] and by_ids["meta_info"]["prompt_tokens"] == len(ids)


def test_logprobs_in_sglangs_shape(live_server: Server) -> None:
    body = {"text": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "top_logprobs_num": 2,
            "logprob_start_len": 0, "return_text_in_logprobs": True}
    meta = _post(live_server, body).json()["meta_info"]
    want = _completion(live_server)["logprobs"]
    out = meta["output_token_logprobs"]
    assert [e[0] for e in out] == pytest.approx(want["token_logprobs"], abs=1e-5)
    assert [e[2] for e in out] == want["tokens"]
    assert all(len(tops) == 2 and tops[0][0] >= tops[1][0] for tops in meta["output_top_logprobs"])
    prompt = meta["input_token_logprobs"]
    assert len(prompt) == meta["prompt_tokens"] and prompt[0][0] is None and all(e[0] < 0 for e in prompt[1:])
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][1]) == 2
    tail = _post(live_server, {**body, "logprob_start_len": 2, "return_text_in_logprobs": False}).json()["meta_info"]
    assert tail["input_token_logprobs"] == [[e[0], e[1], None] for e in prompt[2:]]


def test_a_batch_with_samples_in_order(live_server: Server) -> None:
    body = {"text": [PROMPT, "hello"], "sampling_params": [{**GREEDY, "n": 2}, {**GREEDY, "n": 2, "max_new_tokens": 3}]}
    out = _post(live_server, body).json()
    assert isinstance(out, list) and [o["index"] for o in out] == [0, 1, 2, 3]
    assert [len(o["output_ids"]) for o in out] == [8, 8, 3, 3]
    assert out[0]["text"] == out[1]["text"]  # greedy samples agree
    assert len({o["meta_info"]["id"] for o in out}) == 4
    assert _post(live_server, {**body, "sampling_params": [GREEDY]}).status_code == 400


def test_stream_as_sglangs_bench_reads_it(live_server: Server) -> None:
    """bench_serving's sglang backend: each `data:` event's text is the text so far and
    meta_info.completion_tokens the tokens so far; the stream ends with [DONE]."""
    body = {"text": PROMPT, "sampling_params": GREEDY, "stream": True, "stream_options": {"include_usage": True},
            "return_logprob": False, "logprob_start_len": -1}
    events = []
    with httpx.stream("POST", live_server.url + "/generate", json=body, headers=live_server.headers, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    whole = _post(live_server, {"text": PROMPT, "sampling_params": GREEDY}).json()
    assert texts[-1] == whole["text"] and chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_stop_string_and_token_finish(live_server: Server) -> None:
    free = _post(live_server, {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 16}}).json()
    stop = free["text"][2:5]
    cut = _post(live_server, {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 16, "stop": stop}}).json()
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert cut["text"] == free["text"][: free["text"].index(stop)]
    token = free["output_ids"][3]
    by_token = _post(live_server, {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 16,
                                                                       "stop_token_ids": [token]}}).json()
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}


@pytest.mark.parametrize("body, field", [
    ({"sampling_params": GREEDY}, "text"),
    ({"text": PROMPT, "input_ids": [1, 2], "sampling_params": GREEDY}, "text"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "max_new_token": 4}}, "max_new_token"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "json_schema": "{}"}}, "json_schema"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "regex": "a+"}}, "regex"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 10**6}}, "max_new_tokens"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 0}}, "max_new_tokens"),
    ({"text": PROMPT, "sampling_params": {**GREEDY, "temperature": -1}}, "temperature"),
    ({"text": PROMPT, "image_data": "x.png"}, "image_data"),
    ({"text": PROMPT, "lora_path": "adapter"}, "lora_path"),
    ({"input_ids": [10**6], "sampling_params": GREEDY}, "prompt"),
])
def test_bad_input_is_a_400_naming_the_field(live_server: Server, body: dict, field: str) -> None:
    r = _post(live_server, body)
    assert r.status_code == 400, r.text
    assert field in json.dumps(r.json()), r.json()


def test_cached_tokens_and_defaults(live_server: Server) -> None:
    stem = " ".join(f"g{i}" for i in range(40))
    _post(live_server, {"text": stem, "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    again = _post(live_server, {"text": stem + " more", "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    assert again.json()["meta_info"]["cached_tokens"] > 0
    default = _post(live_server, {"text": PROMPT, "sampling_params": {"temperature": 0, "ignore_eos": True}}).json()
    assert len(default["output_ids"]) == 128  # SGLang's max_new_tokens when nothing sets it
