"""What an operator sees of a running server: the stats line, --log-requests, the log level in every
process, no access log by default, named processes, and SGLang's native routes (/tokenize,
/detokenize, /get_model_info, /version) with /v1/models free of file paths."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from minisgl import __version__
from server_harness import SERVER_FLAGS, Server, running_server

STATS_LINE = re.compile(
    r"engine .*Decode batch\. #running-req: (\d+), #token: (\d+), token usage: ([\d.]+), "
    r"gen throughput \(token/s\): ([\d.]+), input throughput \(token/s\): ([\d.]+), #queue-req: (\d+), "
    r"#compiles: (\d+)")


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory, _isolated_cache: None) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("ops"), *SERVER_FLAGS, "--log-level", "info", "--log-requests",
                        "--decode-log-interval", "3") as server:
        yield server


def _log_once(server: Server, pattern: str, timeout: float = 10.0) -> str:
    """The server's log once `pattern` appears in it (output reaches the file asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = server.log.read_text(errors="replace")
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in the log:\n{server.log_tail()}")


def test_stats_line_and_request_log(ops_server: Server) -> None:
    r = ops_server.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8, "ignore_eos": True,
                                                 "temperature": 0, "seed": 3})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    log = _log_once(ops_server, r"Finish: rid=.*finish_reason=length")
    # 8 tokens at one line per 3 decode steps: at least two lines, and the first saw the request running.
    lines = STATS_LINE.findall(log)
    assert len(lines) >= 2, log[-3000:]
    running, tokens, usage, gen, prefill, queued, compiles = lines[0]
    pool_tokens = ops_server.wait_idle()["total_pages"] * 16  # --page-size 16
    assert int(running) == 1 and int(tokens) % 16 == 0 and int(tokens) > 0
    assert float(usage) == pytest.approx(int(tokens) / pool_tokens, abs=0.005) and float(gen) > 0
    assert float(prefill) > 0 and int(queued) == 0 and int(compiles) == 0  # the CPU compiles nothing
    receive = re.search(rf"Receive: id={re.escape(rid)}, rids=\[.*\], prompt_tokens=\[(\d+)\], params=(.*)", log)
    assert receive is not None and int(receive.group(1)) > 0
    assert "'max_tokens': 8" in receive.group(2) and "'seed': 3" in receive.group(2)
    finish = re.search(r"Finish: rid=.*finish_reason=length, prompt_tokens=\d+, completion_tokens=(\d+), "
                       r"cached_tokens=\d+", log)
    assert finish is not None and finish.group(1) == "8"


def test_no_access_log_by_default(ops_server: Server) -> None:
    assert ops_server.get("/v1/models").status_code == 200
    ops_server.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    _log_once(ops_server, r"Finish: rid=")
    assert not re.search(r'"(GET|POST) /v1/\S+ HTTP/1\.1" \d{3}', ops_server.log.read_text(errors="replace"))


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="process names are Linux's /proc/PID/comm")
def test_processes_are_named(ops_server: Server) -> None:
    info = ops_server.get("/server_info").json()
    assert _comm(ops_server.proc.pid) == "minisgl-api"
    assert _comm(info["engine_pid"]) == "minisgl-engine"
    assert _comm(info["detokenizer_pid"]) == "minisgl-detok"


def test_log_level_reaches_every_process(ops_server: Server, live_server: Server) -> None:
    info = ops_server.log.read_text(errors="replace")
    for tag in ("engine", "detok"):  # each child logs at info on start-up
        assert re.search(rf"^\S+ \S+ {tag} INFO ", info, re.M), f"no {tag} INFO line:\n{info[-3000:]}"
    # The shared session server runs at --log-level warning: no process logs an INFO line there.
    assert live_server.get("/health").status_code == 200
    assert not re.search(r"\bINFO\b", live_server.log.read_text(errors="replace"))


def test_tokenize_detokenize(live_server: Server) -> None:
    r = live_server.post("/tokenize", json={"prompt": "def add(a, b):", "add_special_tokens": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 256
    back = live_server.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"text": "def add(a, b):"}
    batch = live_server.post("/tokenize", json={"prompt": ["a", "bc d"], "add_special_tokens": False}).json()
    assert [len(t) for t in batch["tokens"]] == batch["count"]
    texts = live_server.post("/detokenize", json={"tokens": batch["tokens"]}).json()
    assert texts == {"text": ["a", "bc d"]}
    # Messages: the ids of the chat template's prompt (HF's own rendering is the reference).
    messages = [{"role": "user", "content": "hi"}]
    chat = live_server.post("/tokenize", json={"messages": messages}).json()
    tokenizer = AutoTokenizer.from_pretrained(live_server.get("/get_model_info").json()["tokenizer_path"])
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("route, body, field", [
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "prompt and messages"),
    ("/tokenize", {"prompt": "x", "model": "other"}, "other"),
    ("/tokenize", {"prompt": "x", "bogus": 1}, "bogus"),
    ("/tokenize", {"messages": [{"role": "user", "content": "y"}], "chat_template_kwargs": {"messages": []}},
     "may not set messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "y"}], "chat_template_kwargs": {"enable_thinking": 1}},
     "enable_thinking"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
])
def test_native_routes_reject_bad_input(live_server: Server, route: str, body: dict, field: str) -> None:
    r = live_server.post(route, json=body)
    assert r.status_code in (400, 404), r.text
    assert field in r.text


def test_model_info_version_and_models(live_server: Server) -> None:
    info = live_server.get("/get_model_info").json()
    assert set(info) == {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params",
                         "weight_version"}
    assert info["is_generation"] is True and Path(info["model_path"], "config.json").is_file()
    assert live_server.get("/version").json() == {"version": __version__}
    card = live_server.get("/v1/models").json()["data"][0]
    assert card["id"] == "minisgl-tiny"
    assert info["model_path"] not in live_server.get("/v1/models").text  # no server path leaks here
