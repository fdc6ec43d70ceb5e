"""Colocated tensor / expert parallelism on one multi-GPU node, dummy weights at real shapes: the
decode step (CUDA graphs that hold each rank's collectives) and offline served throughput (the
scheduler's continuous batching with chunked prefill), for one TP/EP layout per run.

    python benchmarks/bench_tp.py --model Qwen3.5-122B-A10B --tp 8 [--ep 1] [--batches 1,16,64]
        [--context 2048] [--prompts 64 --input-len 1024 --output-len 128] [--out DIR]

`benchmarks/tp_session.sh` runs the issue's layouts (122B at TP 1/2/4/8, 397B at TP 8 and
TP 8 + EP 8) in one device call. The pool is pinned (--num-pages from the per-rank weight and pool
bytes, computed on the meta device), so start-up compiles only the decode graphs; the served run
is preceded by a warm-up run of the same shapes. Every figure is per step or per second and also
per GPU, so layouts on different GPU counts compare. The collective bytes per step are printed
from the layout's arithmetic (engine docs: docs/parallelism.md).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from bench_decode import decode_batch, time_steps
from full_vocab_tokenizer import write_full_vocab_tokenizer
from gpu_timing import table
from minisgl import LLM
from minisgl.bench.dataset import random_requests
from minisgl.bench.offline import run as run_offline
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import EnginePlan, resolve_plan
from minisgl.kvcache.pages import _num_pages
from minisgl.models.config import ModelConfig, load_config
from minisgl.models.context import Backends
from minisgl.models.known_configs import config_dir, hf_config
from minisgl.models.materialize import build_module
from minisgl.models.registry import MODELS
from minisgl.parallel.config import ParallelConfig
from minisgl.tokenizer.tokenizer import load_tokenizer

GIB = 1 << 30
RESERVE = 8 * GIB  # per rank: prefill activations (16K-token steps), graph pools, logits, NCCL buffers
PAGE = 64


def rank_bytes(plan: EnginePlan) -> tuple[int, int, int]:
    """(weights, one state slot, one KV page) of TP rank 0, from a meta-device build."""
    args, config, dtype = plan.args, plan.config, plan.dtype
    pc = ParallelConfig(args.tp_size, 0, args.ep_size, tuple(range(args.tp_size)), group=object())
    arch = MODELS.get(config.arch)
    model = build_module(lambda: arch(config, Backends(None, None, None), None, pc), dtype, torch.device("meta"),
                         plan.fp8)
    layout = plan.layout(pc)
    return (sum(p.nbytes for p in model.parameters()), layout.state_bytes_per_slot(dtype, torch.float32),
            layout.kv_bytes_per_page(PAGE, dtype))


def collective_bytes(config: ModelConfig, tp: int, tokens: int, itemsize: int = 2) -> dict[str, float]:
    """Payload of each collective kind in one step of `tokens` tokens (MB), and how many there are."""
    if tp == 1:
        return {"collectives/step": 0}
    h, layers = config.hidden_size, config.num_layers
    return {
        "collectives/step": 2 * layers + 3,  # per layer: mixer + MoE all-reduce; ids, embedding, logits
        "all-reduce MB each": tokens * h * itemsize / 1e6,
        "all-reduce MB/step": (2 * layers + 1) * tokens * h * itemsize / 1e6,
        "logits all-gather MB": tokens * config.vocab_size * itemsize / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3.5-122B-A10B")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--model-root", default="/tmp/minisgl-models")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    cli = ap.parse_args()
    batches = [int(b) for b in cli.batches.split(",")]
    name = f"{cli.model}-tp{cli.tp}-ep{cli.ep}"
    path = config_dir(cli.model, fp8=True, root=cli.model_root)
    text = hf_config(cli.model, True)["text_config"]
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        write_full_vocab_tokenizer(path, text["vocab_size"], text["bos_token_id"])
    config = load_config(path)
    max_len = max(cli.context, cli.input_len + cli.output_len) + 64
    slots = max(max(batches), cli.prompts)
    probe = EngineArgs(path, load_format="dummy", device="cuda", tp_size=cli.tp, ep_size=cli.ep)
    weights, slot_bytes, page_bytes = rank_bytes(resolve_plan(probe))
    free, total = torch.cuda.mem_get_info()
    pages = min(slots * _num_pages(max_len, PAGE), (free - weights - RESERVE - (slots + 1) * slot_bytes) // page_bytes)
    memory = {"layout": name, "GPUs": cli.tp, "weights/GPU GiB": weights / GIB, "free GiB": free / GIB,
              "KV+state/GPU GiB": (pages * page_bytes + slots * slot_bytes) / GIB, "pages": int(pages),
              f"requests at {max_len} tokens": int(min(slots, pages // _num_pages(max_len, PAGE)))}
    print(table([memory], f"{name}: memory per GPU (rank 0)"), flush=True)
    if pages < _num_pages(max_len, PAGE):
        raise SystemExit(f"{name}: the weights leave no room for one request of {max_len} tokens")
    started = time.monotonic()
    llm = LLM(path, load_format="dummy", tp_size=cli.tp, ep_size=cli.ep, context_length=max_len, page_size=PAGE,
              max_running_requests=slots, num_pages=int(pages), cuda_graph_max_bs=max(batches))
    memory["start s"] = time.monotonic() - started
    engine, pool = llm.engine, llm.engine.pool
    rows = []
    for b in batches:
        if b > min(pool.free_slots, pool.available_pages // _num_pages(cli.context + 1, PAGE)):
            rows.append({"B": b, "step ms": "does not fit"})
            continue
        batch, held = decode_batch(engine, b, cli.context)
        ms = time_steps(engine, batch)
        rows.append({"B": b, "context": cli.context, "step ms": ms, "tokens/s": b / ms * 1e3,
                     "tokens/s/GPU": b / ms * 1e3 / cli.tp, **collective_bytes(config, cli.tp, b)})
        print(rows[-1], flush=True)
        for s in held:
            pool.free(s)
    print(table(rows, f"{name}: decode step (CUDA graphs, collectives inside)"), flush=True)
    tokenizer = load_tokenizer(path)
    reqs = random_requests(tokenizer, cli.prompts, cli.input_len, cli.output_len, 1.0, seed=0)
    warm = run_offline(llm, reqs[: max(1, cli.prompts // 4)], ignore_eos=True)  # compiles the prefill shapes
    served = run_offline(llm, reqs, ignore_eos=True)
    served["output_throughput_per_gpu"] = served["output_throughput"] / cli.tp
    served["total_throughput_per_gpu"] = served["total_throughput"] / cli.tp
    print(table([served], f"{name}: served offline, {cli.prompts} x {cli.input_len}/{cli.output_len}"), flush=True)
    llm.close()
    os.makedirs(cli.out, exist_ok=True)
    with open(os.path.join(cli.out, f"bench_tp_{name}.json"), "w") as f:
        json.dump({"memory": memory, "decode": rows, "served": served, "warm_up_run": warm}, f, indent=1)


if __name__ == "__main__":
    main()
