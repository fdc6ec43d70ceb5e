"""End-to-end serving benchmark with no checkpoint: starts the real server on a config-only model
directory (a known config, a tokenizer with the model's full vocabulary, `--load-format dummy`),
runs the bench client over a matrix of shapes, records the server's compile count around every
row, writes JSON and stops the server. Made to fit one device call.

    python benchmarks/serve_matrix.py --matrix h200-122b --out $OUT          # issue matrix, 122B FP8
    python benchmarks/serve_matrix.py --matrix vllm-35b --out $OUT           # vLLM's published profiles
    python benchmarks/serve_matrix.py --matrix shared-prefix-35b --out $OUT  # SGLang's shared-prefix workload
    python benchmarks/serve_matrix.py --matrix smoke --out /tmp/m            # tiny model, CPU: the script itself
Extra server flags go after `--`, e.g. `-- --chunked-prefill-size 1024`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from full_vocab_tokenizer import write_full_vocab_tokenizer  # noqa: E402

from minisgl.bench import serve  # noqa: E402
from minisgl.bench.dataset import random_requests, shared_prefix_requests  # noqa: E402
from minisgl.bench.report import summarize  # noqa: E402
from minisgl.models.known_configs import config_dir, hf_config  # noqa: E402
from minisgl.tokenizer.tokenizer import load_tokenizer  # noqa: E402


@dataclass(frozen=True)
class Row:
    name: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int | None  # None: all at once
    groups: int = 0  # > 0: the generated-shared-prefix dataset, num_prompts split into this many groups
    shared_len: int = 0  # ... whose prompts share their first shared_len of input_len tokens
    turns: int = 0  # > 0: agent conversations (num_prompts of them) of this many turns, first prompts of
    tool_len: int = 0  # input_len tokens, each next one the last prompt, its answer and tool_len tokens
    chat: bool = False  # ... held as messages through /v1/chat/completions (the chat template renders them)


@dataclass(frozen=True)
class Matrix:
    model: str | None  # a known config, or None for the embedded tiny model
    fp8: bool
    server_args: tuple[str, ...]
    rows: tuple[Row, ...]


MATRICES = {
    # Issue matrix on one H200: the README's one-GPU command (no --max-running-requests).
    "h200-122b": Matrix("Qwen3.5-122B-A10B", True, ("--context-length", "32768"), (
        Row("first request after ready", 1024, 128, 1, 1),
        Row("1K/128 c=1", 1024, 128, 8, 1),
        Row("1K/256 c=64", 1024, 256, 128, 64),
        Row("8K/256 c=32", 8192, 256, 64, 32),
        Row("8K/256 c=64", 8192, 256, 128, 64),
        Row("Lone 8K prompts 8192/16 c=1", 8192, 16, 4, 1),  # a long document on an idle server: TTFT
    )),
    # The three random-prompt profiles vLLM 0.17.1 was published with for Qwen3.5-35B-A3B on one H200.
    "vllm-35b": Matrix("Qwen3.5-35B-A3B", True, ("--context-length", "33024"), (
        Row("first request after ready", 1024, 128, 1, 1),
        Row("Throughput 1024/128 x1000", 1024, 128, 1000, 512),
        Row("Generation Heavy 1000/2000 x200", 1000, 2000, 200, 200),
        Row("Long Context 32000/100 x100", 32000, 100, 100, 100),
        # Long documents one at a time on an idle server: the prompt alone sets the TTFT.
        Row("Lone 8K prompts 8192/16 c=1", 8192, 16, 4, 1),
        Row("Lone 32K prompts 32000/16 c=1", 32000, 16, 4, 1),
    )),
    # sglang.bench_serving's generated-shared-prefix defaults (64 groups x 16 prompts, a 2048-token
    # system prompt and a 128-token question, 256 out): the prefix cache's workload.
    "shared-prefix-35b": Matrix("Qwen3.5-35B-A3B", True, ("--context-length", "33024"), (
        Row("first request after ready", 1024, 128, 1, 1),
        Row("Shared prefix 64x16 2048+128/256", 2176, 256, 1024, 256, groups=64, shared_len=2048),
        Row("Random 2176/256 x1024", 2176, 256, 1024, 256),  # the same sizes sharing nothing: the cost
        Row("Agent 64x6 turns 4096+512/256 c=32", 4096, 256, 64, 32, turns=6, tool_len=512),
        Row("Chat 64x6 turns 4096+512/256 c=32", 4096, 256, 64, 32, turns=6, tool_len=512, chat=True),
    )),
    "smoke": Matrix(None, False, ("--device", "cpu", "--context-length", "256"), (
        Row("first request after ready", 16, 8, 1, 1),
        Row("16/8 c=4", 16, 8, 8, 4),
    )),
    # The tiny model on the CPU under the shared-prefix workload (with and without the cache: add
    # `-- --disable-radix-cache`).
    "smoke-shared-prefix": Matrix(None, False, ("--device", "cpu", "--context-length", "1024"), (
        Row("first request after ready", 16, 8, 1, 1),
        # Questions longer than a page, as in SGLang's defaults (2048 + 128 at 64-token pages).
        Row("Shared prefix 8x8 512+96/8 c=4", 608, 8, 64, 4, groups=8, shared_len=512),
        Row("Random 608/8 c=4", 608, 8, 64, 4),
        Row("Agent 8x4 turns 512+64/16 c=4", 512, 16, 8, 4, turns=4, tool_len=64),
        Row("Chat 8x4 turns 512+64/16 c=4", 512, 16, 8, 4, turns=4, tool_len=64, chat=True),
        Row("Chat 32x1 608/8 c=4", 608, 8, 32, 4, turns=1, chat=True),
        # A chat service's one system prompt at more streams than slots (run with
        # `-- --max-running-requests 4`): every running slot is busy, so only the cache's keep it.
        Row("One system prompt 1x32 512+96/8 c=8", 608, 8, 32, 8, groups=1, shared_len=512),
    )),
}


def model_dir(matrix: Matrix, root: str) -> list[str]:
    """--model-path (and --load-format) for the matrix; known configs get the full-vocabulary tokenizer."""
    if matrix.model is None:
        return []
    path = config_dir(matrix.model, matrix.fp8, root)
    text = hf_config(matrix.model, matrix.fp8)["text_config"]
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        write_full_vocab_tokenizer(path, text["vocab_size"], text["bos_token_id"])
    return ["--model-path", path, "--load-format", "dummy"]


def _server_info(base: str) -> dict:
    """/server_info once the engine has reported its first stats (they follow readiness closely)."""
    for _ in range(60):
        info = httpx.get(base + "/server_info", timeout=30).raise_for_status().json()
        if info["stats"] is not None:
            return info
        time.sleep(0.5)
    raise TimeoutError("the server reported no engine stats within 30 s")


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the server was not ready within {timeout:.0f} s")


def run_row(base: str, model: str, tokenizer, row: Row, seed: int) -> dict:
    before = _server_info(base)["stats"]["compiles"]
    cfg = serve.ServeConfig(base, model, float("inf"), row.concurrency, True, seed)
    if row.turns:
        talks = serve.run_chats if row.chat else serve.run_agents
        results, duration, extra = talks(cfg, tokenizer, row.num_prompts, row.input_len, row.turns, row.tool_len,
                                         row.output_len, progress=False)
    else:
        results, duration = asyncio.run(serve.run(cfg, _row_requests(tokenizer, row, seed), progress=False))
        extra = {}
    figures = {**summarize(results, duration, float("inf"), row.concurrency), **extra}
    errors = sorted({r.error for r in results if not r.ok})
    after = _server_info(base)["stats"]["compiles"]
    return {"row": asdict(row), **figures, "compiles_during": after - before, "errors": errors[:3],
            "ttfts_ms": [round(r.ttft * 1e3, 1) for r in results if r.ok][:16]}


def _row_requests(tokenizer, row: Row, seed: int) -> list:  # noqa: ANN001 - a transformers tokenizer
    if row.groups:
        return shared_prefix_requests(tokenizer, row.groups, row.num_prompts // row.groups, row.shared_len,
                                      row.input_len - row.shared_len, row.output_len, seed)
    return random_requests(tokenizer, row.num_prompts, row.input_len, row.output_len, 1.0, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", choices=sorted(MATRICES), required=True)
    parser.add_argument("--out", required=True, help="folder for the JSON and the server log")
    parser.add_argument("--model-root", default="/tmp/minisgl-models", help="where config-only model dirs go")
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--ready-timeout", type=float, default=900)
    parser.add_argument("--only", help="comma-separated row names to run (default: all)")
    parser.add_argument("server_args", nargs="*", help="extra server flags, after --")
    ns = parser.parse_args()
    matrix = MATRICES[ns.matrix]
    os.makedirs(ns.out, exist_ok=True)
    base = f"http://127.0.0.1:{ns.port}"
    cmd = [sys.executable, "-m", "minisgl", "serve", "--port", str(ns.port), *model_dir(matrix, ns.model_root),
           *matrix.server_args, *ns.server_args]
    log_path = os.path.join(ns.out, f"server_{ns.matrix}.log")
    report: dict = {"matrix": ns.matrix, "command": " ".join(cmd[1:]), "rows": []}

    def save() -> None:  # after every row: a run stopped by its time limit keeps what it measured
        with open(os.path.join(ns.out, f"serve_matrix_{ns.matrix}.json"), "w") as f:
            json.dump(report, f, indent=2)

    # `timeout` sends SIGTERM: end through the finally below, which stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            report["ready_seconds"] = _wait_ready(base, proc, ns.ready_timeout)
            info = _server_info(base)
            report["server_info"] = info["info"]
            save()
            model, root = serve.served_model(base)
            tokenizer = load_tokenizer(root)
            for row in matrix.rows:
                if ns.only and row.name not in ns.only.split(","):
                    continue
                result = run_row(base, model, tokenizer, row, seed=len(report["rows"]) + 1)
                report["rows"].append(result)
                save()
                print(f"{row.name}: failed {result['failed']}, out {result['output_throughput']:.0f} tok/s, "
                      f"total {result['total_throughput']:.0f} tok/s, TTFT med {result['median_ttft_ms']:.0f} ms, "
                      f"ITL med {result['median_itl_ms']:.1f} P99 {result['p99_itl_ms']:.1f} ms, "
                      f"cached {result['total_cached_tokens']} of {result['total_input_tokens']} prompt tokens, "
                      f"duration {result['duration']:.1f} s, compiles {result['compiles_during']}", flush=True)
            report["compiles_after_ready"] = _server_info(base)["stats"]["compiles"] - info["stats"]["compiles"]
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            save()
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1)[:3000])


if __name__ == "__main__":
    main()
