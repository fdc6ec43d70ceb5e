"""The served system's host path alone: the real server (API process, engine process with its
scheduler, detokenizer) on the embedded tiny model on the CPU, with the model's forward replaced by
a stub that sleeps for a step's time and returns logits peaked at one token, against the real
bench client. It shows what the processes around the GPU can sustain: the throughput the client
sees and each process's CPU seconds over the run (the API process must keep up with every stream's
tokens on one event loop; the client too).

    python3 benchmarks/bench_host_path.py --num-prompts 1000 --concurrency 512 --input-len 1024 --output-len 128

The server process is this file run again with `serve` (the engine's spawned process re-imports it
as its main module, so the stub applies there)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import torch

STEP_ENV = "MINISGL_STUB_STEP_S"
STUB_TOKEN = 400  # " size" in the tiny model's vocabulary: whole text, so every token streams as it comes


def _stub_forward(self, batch, rows=None):  # noqa: ANN001, ANN202 (Engine.forward_batch's signature)
    time.sleep(float(os.environ[STEP_ENV]))
    logits = torch.zeros(batch.logit_idx.numel() if rows is None else rows.numel(), self.model.config.vocab_size)
    logits[:, STUB_TOKEN] = 1.0
    return logits


if os.environ.get(STEP_ENV):
    from minisgl.engine import engine as _engine

    _engine.Engine.forward_batch = _stub_forward


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _process_tree(root: int) -> dict[int, str]:
    """pid -> process name for root and its descendants (from /proc: ppid links)."""
    parents, names = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            names[int(entry)] = text[text.index("(") + 1 : text.rindex(")")]
            parents[int(entry)] = int(text.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        tree.update(kids)
        frontier += kids
    return {p: names[p] for p in tree if p in names}


def main() -> None:
    from minisgl.bench import serve
    from minisgl.bench.dataset import BenchRequest
    from minisgl.bench.report import summarize

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=30.0, help="the stub forward's time per step")
    parser.add_argument("--port", type=int, default=31877)
    ns = parser.parse_args()
    pages = ns.concurrency * ((ns.input_len + ns.output_len) // 64 + 2)
    cmd = [sys.executable, os.path.abspath(__file__), "serve", "--device", "cpu", "--port", str(ns.port),
           "--context-length", str(ns.input_len + ns.output_len + 64), "--max-running-requests", str(ns.concurrency),
           "--num-pages", str(pages)]
    env = {**os.environ, STEP_ENV: str(ns.step_ms / 1e3), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{ns.port}"
    try:
        import httpx

        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the stub server did not become ready")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model, _ = serve.served_model(base)
        tree = _process_tree(proc.pid)
        before = {p: _cpu_seconds(p) for p in tree}
        client_before = time.process_time()
        # Distinct prompts of in-vocabulary ids (the tiny model has 512 tokens).
        reqs = [BenchRequest(tuple((i * 7 + j) % 500 + 5 for j in range(ns.input_len)), ns.output_len)
                for i in range(ns.num_prompts)]
        cfg = serve.ServeConfig(base, model, float("inf"), ns.concurrency, True, 1)
        results, duration = asyncio.run(serve.run(cfg, reqs, progress=False))
        client_cpu = time.process_time() - client_before
        cpu = {f"{tree[p]} ({p})": round(_cpu_seconds(p) - before[p], 2) for p in tree if os.path.exists(f"/proc/{p}")}
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    figures = summarize(results, duration, float("inf"), ns.concurrency)
    keep = ("completed", "failed", "duration", "output_throughput", "total_throughput", "median_ttft_ms",
            "median_itl_ms", "p99_itl_ms")
    print(json.dumps({**{k: round(figures[k], 1) for k in keep}, "step_ms": ns.step_ms,
                      "cpu_seconds": {"client": round(client_cpu, 2), **cpu}}, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        from minisgl.__main__ import main as serve_main

        serve_main()
    else:
        main()
