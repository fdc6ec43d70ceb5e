"""The benchmark clients run end to end and their figures add up."""
from __future__ import annotations

import json

from minisgl.bench.__main__ import main
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
