"""The benchmark clients run end to end and their figures add up."""
from __future__ import annotations

import json

import pytest

from minisgl.bench.__main__ import main
from minisgl.bench.report import RequestResult, summarize
from server_harness import Server


def test_bench_serve(live_server: Server, tmp_path, capsys) -> None:
    out = tmp_path / "serve.json"
    main(["serve", "--base-url", live_server.url, "--num-prompts", "12", "--input-len", "24", "--output-len", "5",
          "--random-range-ratio", "0.5", "--max-concurrency", "4", "--request-rate", "50", "--disable-tqdm",
          "--output-json", str(out)])
    block = capsys.readouterr().out
    for label in ("Serving Benchmark Result", "Request throughput (req/s):", "Output token throughput (tok/s):",
                  "Median TTFT (ms):", "P99 TPOT (ms):", "Mean ITL (ms):"):
        assert label in block, label
    figures = json.loads(out.read_text())
    assert figures["completed"] == 12 and figures["failed"] == 0
    assert 12 * 3 <= figures["total_input_tokens"] <= 12 * 24  # lengths drawn from [12, 24] (+ rounding)
    assert 12 * 2 <= figures["total_output_tokens"] <= 12 * 5
    assert 0 < figures["median_ttft_ms"] <= figures["p99_ttft_ms"]
    assert figures["output_throughput"] > 0


def test_bench_offline(tmp_path, capsys) -> None:
    out = tmp_path / "offline.json"
    main(["offline", "--num-prompts", "6", "--input-len", "10", "--output-len", "3", "--device", "cpu",
          "--context-length", "64", "--page-size", "16", "--output-json", str(out)])
    assert "Offline Throughput Result" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["completed"] == 6 and figures["total_output_tokens"] == 18 and figures["total_input_tokens"] == 60


# --- SGLang compatibility: dataset names, the ShareGPT format, numpy percentiles, block order -----

SGLANG_ORDER = ("Backend:", "Traffic request rate:", "Max request concurrency:", "Successful requests:",
                "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
                "Request throughput (req/s):", "Input token throughput (tok/s):", "Output token throughput (tok/s):",
                "Total token throughput (tok/s):", "Concurrency:", "End-to-End Latency", "Mean E2E Latency (ms):",
                "Median E2E Latency (ms):", "Time to First Token", "Mean TTFT (ms):", "Median TTFT (ms):",
                "P99 TTFT (ms):", "Time per Output Token (excl. 1st token)", "Mean TPOT (ms):", "Median TPOT (ms):",
                "P99 TPOT (ms):", "Inter-Token Latency", "Mean ITL (ms):", "Median ITL (ms):", "P95 ITL (ms):",
                "P99 ITL (ms):", "Max ITL (ms):")


def _sharegpt_file(path, tokenizer) -> list[tuple[str, str]]:
    """A small ShareGPT-format file: usable conversations, plus ones the loader must skip."""
    usable = [(f"Write a function number {i} that adds two values and returns the sum.",
               f"def add_{i}(a, b):\n    return a + b\n") for i in range(5)]
    data = [{"id": f"ok{i}", "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
            for i, (q, a) in enumerate(usable)]
    data += [{"id": "one-turn", "conversations": [{"from": "human", "value": "only a question, never answered"}]},
             {"id": "short", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
             {"id": "long", "conversations": [{"from": "human", "value": "word " * 1500},
                                              {"from": "gpt", "value": "a long enough answer to count"}]}]
    path.write_text(json.dumps(data))
    return usable


def test_sharegpt_dataset(tmp_path) -> None:
    from minisgl.bench.dataset import sharegpt_requests
    from minisgl.tokenizer.tokenizer import load_tokenizer
    from minisgl.models.tiny.default import default_model_path

    tok = load_tokenizer(default_model_path())
    usable = _sharegpt_file(tmp_path / "sg.json", tok)
    reqs = sharegpt_requests(tok, str(tmp_path / "sg.json"), 5, seed=0)
    expected = {(tuple(tok.encode(q)), len(tok.encode(a, add_special_tokens=False))) for q, a in usable}
    assert {(r.prompt_ids, r.output_len) for r in reqs} == expected  # the one-turn, short and long ones skipped
    assert [r.output_len for r in sharegpt_requests(tok, str(tmp_path / "sg.json"), 2, 0, output_len=7)] == [7, 7]
    with pytest.raises(ValueError, match="5 of its 7 conversations fit"):
        sharegpt_requests(tok, str(tmp_path / "sg.json"), 6, seed=0)
    (tmp_path / "bad.json").write_text('[{"conversations": "not a list"}]')
    with pytest.raises(ValueError, match="item 0 needs a \"conversations\" list"):
        sharegpt_requests(tok, str(tmp_path / "bad.json"), 1, seed=0)


def test_bench_serve_sharegpt(live_server: Server, tmp_path, capsys) -> None:
    from minisgl.tokenizer.tokenizer import load_tokenizer
    from minisgl.models.tiny.default import default_model_path

    usable = _sharegpt_file(tmp_path / "sg.json", load_tokenizer(default_model_path()))
    out = tmp_path / "serve.json"
    main(["serve", "--base-url", live_server.url, "--dataset-name", "sharegpt", "--dataset-path",
          str(tmp_path / "sg.json"), "--num-prompts", "5", "--sharegpt-output-len", "4", "--disable-tqdm",
          "--output-json", str(out)])
    block = capsys.readouterr().out
    rows = [line.split("  ")[0].strip() if not line.startswith(("-", "=")) else line.strip("-= ")
            for line in block.splitlines()[1:-1]]
    assert [r for r in rows if r in SGLANG_ORDER] == list(SGLANG_ORDER)
    figures = json.loads(out.read_text())
    assert figures["dataset_name"] == "sharegpt" and figures["completed"] == len(usable) == 5
    assert figures["total_output_tokens"] == 5 * 4
    for stat in ("mean", "median", "std", "p90", "p95", "p99"):
        assert f"{stat}_ttft_ms" in figures and f"{stat}_itl_ms" in figures


def test_shared_prefix_dataset() -> None:
    from minisgl.bench.dataset import shared_prefix_requests
    from minisgl.tokenizer.tokenizer import load_tokenizer
    from minisgl.models.tiny.default import default_model_path

    tok = load_tokenizer(default_model_path())
    reqs = shared_prefix_requests(tok, groups=3, per_group=4, system_len=20, question_len=5, output_len=6, seed=0)
    assert len(reqs) == 12 and all(len(r.prompt_ids) == 25 and r.output_len == 6 for r in reqs)
    systems = {r.prompt_ids[:20] for r in reqs}
    assert len(systems) == 3 and all(sum(r.prompt_ids[:20] == s for r in reqs) == 4 for s in systems)
    assert len({r.prompt_ids for r in reqs}) == 12  # every question its own
    assert not set(tok.all_special_ids) & {t for r in reqs for t in r.prompt_ids}
    assert [r.prompt_ids[:20] for r in reqs[:4]] != [reqs[0].prompt_ids[:20]] * 4  # shuffled, not by group
    with pytest.raises(ValueError, match="--gsp-num-groups"):
        shared_prefix_requests(tok, 0, 4, 20, 5, 6, 0)


def test_bench_serve_shared_prefix(live_server: Server, tmp_path, capsys) -> None:
    out = tmp_path / "gsp.json"
    main(["serve", "--base-url", live_server.url, "--dataset-name", "generated-shared-prefix", "--gsp-num-groups",
          "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "100", "--gsp-question-len", "8",
          "--gsp-output-len", "3", "--max-concurrency", "1", "--disable-tqdm", "--output-json", str(out)])
    capsys.readouterr()
    figures = json.loads(out.read_text())
    assert figures["completed"] == 8 and figures["total_input_tokens"] == 8 * 108
    assert figures["total_output_tokens"] == 8 * 3
    # One at a time: a group's first prompt is like no other yet, so it is prefilled in one go; its
    # second stops early to cache the 80 tokens (whole pages of 16, at least 16 before the end of its
    # 108-token prompt) of the system prompt, which the group's last two reuse.
    assert figures["total_cached_tokens"] == 2 * 2 * 80


def test_bench_serve_agent_turns(live_server: Server, tmp_path, capsys) -> None:
    out = tmp_path / "agent.json"
    main(["serve", "--base-url", live_server.url, "--dataset-name", "agent-turns", "--agent-conversations", "3",
          "--agent-turns", "3", "--agent-first-len", "100", "--agent-tool-len", "8", "--output-len", "4",
          "--max-concurrency", "2", "--disable-tqdm", "--output-json", str(out)])
    assert "TTFT by turn" in capsys.readouterr().out
    figures = json.loads(out.read_text())
    assert figures["completed"] == 9 and figures["failed"] == 0 and len(figures["turn_ttft_ms"]) == 3
    # Prompts of 100, 112 and 124 tokens: each later turn takes over all the last one fed (its prompt
    # and 3 of its 4 output tokens: the last one sampled is never fed).
    assert figures["total_input_tokens"] == 3 * (100 + 112 + 124)
    assert figures["total_cached_tokens"] == 3 * (103 + 115)



def test_bench_serve_chat_turns(live_server: Server, tmp_path, capsys) -> None:
    """Chat conversations as messages: the server renders each turn with its chat template, and each
    turn after the first reuses all its last turn's prompt but that one's tail (from the last page
    boundary 16 tokens before its end, at the server's 16-token pages), where the template re-rendered it."""
    from minisgl.bench import serve
    from minisgl.tokenizer.tokenizer import load_tokenizer

    model, root = serve.served_model(live_server.url)
    tokenizer = load_tokenizer(root)
    cfg = serve.ServeConfig(live_server.url, model, float("inf"), 2, True, seed=3)
    results, _, extra = serve.run_chats(cfg, tokenizer, 3, 100, 3, 8, 4, progress=False)
    assert len(results) == 9 and all(r.ok for r in results) and len(extra["turn_ttft_ms"]) == 3
    for talk in (results[0:3], results[3:6], results[6:9]):
        assert all(r.output_len == 4 and r.output_text for r in talk)
        assert talk[1].input_len > talk[0].input_len + 8 and talk[2].input_len > talk[1].input_len + 8
        for last, turn in zip(talk, talk[1:]):
            assert turn.cached_len == (last.input_len - 16) // 16 * 16 > 0


def test_bench_flags_as_sglang(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--dataset-name", "sharegpt", "--base-url", "http://127.0.0.1:9"])
    assert "--dataset-name sharegpt needs --dataset-path" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--base-url", "http://127.0.0.1:9"])  # nothing listens on the discard port
    assert "cannot ask http://127.0.0.1:9 for its model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--dataset-name", "lmsys"])
    assert "invalid choice: 'lmsys'" in capsys.readouterr().err


def test_percentiles_are_numpys() -> None:
    """Latencies 100..400 ms: linear interpolation (numpy.percentile), not the nearest rank."""
    results = [RequestResult(True, 4, 2, latency=t + 0.01, ttft=t, itl=(0.01,)) for t in (0.1, 0.2, 0.3, 0.4)]
    s = summarize(results, duration=1.0, request_rate=float("inf"), max_concurrency=None)
    assert s["p90_ttft_ms"] == pytest.approx(370.0) and s["p95_ttft_ms"] == pytest.approx(385.0)
    assert s["p99_ttft_ms"] == pytest.approx(397.0) and s["median_ttft_ms"] == pytest.approx(250.0)
    assert s["std_ttft_ms"] == pytest.approx(111.80339887)  # population std of 100, 200, 300, 400
    assert s["max_itl_ms"] == pytest.approx(10.0)


def test_concurrency_cap_holds_and_results_keep_request_order(monkeypatch) -> None:
    import asyncio

    from minisgl.bench import serve
    from minisgl.bench.dataset import BenchRequest
    from minisgl.bench.report import RequestResult

    live = {"now": 0, "peak": 0}

    async def fake_one(client, cfg, req):  # noqa: ANN001, ANN202
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        await asyncio.sleep(0.002 * (req.output_len % 5 + 1))
        live["now"] -= 1
        return RequestResult(True, len(req.prompt_ids), req.output_len, 0.01, 0.005, ())

    monkeypatch.setattr(serve, "_one", fake_one)
    reqs = [BenchRequest((1, 2, 3), i) for i in range(200)]
    cfg = serve.ServeConfig("http://127.0.0.1:9", "m", float("inf"), 40, True, 1)
    results, _ = asyncio.run(serve.run(cfg, reqs, progress=False))
    assert [r.output_len for r in results] == list(range(200))  # in request order
    assert live["peak"] == 40


def test_streamed_pieces_time_reasoning_but_send_back_only_content() -> None:
    """A chat answer's reasoning (SGLang's reasoning_content, vLLM's reasoning) is a streamed token to
    time, but a chat client sends back only the content."""
    from minisgl.bench.serve import _piece

    assert _piece({"text": "ab"}) == ("ab", "ab")
    assert _piece({"delta": {"content": "c"}}) == ("c", "c")
    assert _piece({"delta": {"reasoning_content": "r", "content": None}}) == ("r", "")
    assert _piece({"delta": {"reasoning": "r"}}) == ("r", "")
    assert _piece({"delta": {"role": "assistant"}}) == ("", "")
