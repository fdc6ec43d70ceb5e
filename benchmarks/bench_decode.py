"""Decode steps of a full Qwen3.5 FP8 model (default Qwen3.5-122B-A10B) on one GPU, with dummy
weights, against the roofline of the bytes each step must read.

    python benchmarks/bench_decode.py [--model NAME] [--layers N] [--batches 1,8,32,64] [--contexts 1024,8192]
        [--kv-cache-dtype fp8_e4m3] [--mamba-ssm-dtype bfloat16]

The engine runs `--load-format dummy` on the real config (seeded random weights in the FP8
layout), the Triton backends and CUDA graphs. For each context and batch, every request sits at
that context (its K/V pages filled with random values) and decodes one token per step; the step
time is the median of CUDA-graph replays. The roofline step reads every weight a decode step
touches once (the experts its routing actually hit, counted per layer in an eager step; not the
embedding table), the requests' K/V, and reads and writes their GDN state, at the copy bandwidth
measured in the same run. Also prints the memory left for KV/state after loading, the largest
batch that fits at the largest context, and a torch.profiler table of one decode step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from dataclasses import dataclass, replace

import torch

from gpu_timing import copy_tbps, table
from minisgl.attention.paged_kv import cache_values
from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.kvcache.pages import _num_pages
from minisgl.models.known_configs import config_dir
from minisgl.models.materialize import build_module
from minisgl.models.registry import MODELS
from minisgl.moe.local_moe import LocalMoE
from minisgl.moe.router import route

MODEL = "Qwen3.5-122B-A10B"
GIB = 1 << 30
RESERVE = 3 * GIB  # activations, graph pools, logits, allocator slack


@dataclass(frozen=True)
class Plan:
    """Byte counts from meta-device builds of the model and a one-slot pool (no memory taken)."""

    weights: int
    state_per_slot: int
    page: int
    pages_per_request: int  # at the context limit

    @property
    def per_request(self) -> int:
        return self.state_per_slot + self.pages_per_request * self.page


def plan_bytes(args: EngineArgs) -> Plan:
    plan = resolve_plan(replace(args, device="cuda"))
    meta = torch.device("meta")
    arch = MODELS.get(plan.config.arch)
    backends = plan.backends.build()
    model = build_module(lambda: arch(plan.config, backends), plan.dtype, meta, plan.fp8)
    pool = HybridPool(plan.layout(), plan.pool, plan.dtype, meta)
    page = pool.kv.nbytes // pool.kv.k.shape[1] * pool.page_size
    return Plan(sum(p.nbytes for p in model.parameters()), pool.state.bytes_per_slot, page, pool.cfg.pages_per_request)


def touched_experts(engine: Engine, batch) -> list[int]:
    """Distinct experts each MoE layer's router picks for `batch` (one eager step)."""
    counts: list[int] = []
    hooks = []
    for layer in engine.model.layers:
        moe = layer.mlp
        if isinstance(moe, LocalMoE):
            hook = lambda m, inp, out, k=moe.top_k, r=moe.renormalize: counts.append(  # noqa: E731
                int(route(out, k, r)[1].unique().numel()))
            hooks.append(moe.gate.register_forward_hook(hook))
    with torch.inference_mode():
        engine.model(batch, engine.pool)
    for h in hooks:
        h.remove()
    return counts


def step_bytes(engine: Engine, touched: list[int], batch_size: int, context: int) -> dict[str, int]:
    model, pool = engine.model, engine.pool
    experts = [layer.mlp.experts for layer in model.layers]
    expert_total = sum(p.nbytes for ex in experts for p in ex.parameters())
    per_expert = expert_total // (len(experts) * engine.config.num_experts)
    other = sum(p.nbytes for p in model.parameters()) - expert_total - model.embed_tokens.weight.nbytes
    kv_per_token = pool.kv.nbytes // pool.kv.k.shape[1]
    return {
        "weights": other + sum(touched) * per_expert,
        "kv": batch_size * context * kv_per_token,
        "state": 2 * batch_size * pool.state.bytes_per_slot,
    }


def time_steps(engine: Engine, batch, steps: int = 20) -> float:
    """Median ms of one decode step (a graph replay, inputs copied in), over `steps` steps."""
    for _ in range(3):
        engine.forward_batch(batch)
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        engine.forward_batch(batch)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def decode_batch(engine: Engine, batch_size: int, context: int) -> tuple[object, list[int]]:
    slots = [engine.pool.allocate(context + 1) for _ in range(batch_size)]
    for s in slots:
        engine.pool.ensure_tokens(s, context + 1)
    tokens = torch.randint(0, engine.config.vocab_size, (batch_size,)).tolist()
    return engine.make_batch([[t] for t in tokens], [context] * batch_size, slots), slots


def profile_step(engine: Engine, batch) -> str:
    """Top kernels of one decode step: the graph replay if the profiler sees its kernels, else eager."""
    for replay in (True, False):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.inference_mode():
                engine.forward_batch(batch) if replay else engine.model(batch, engine.pool)
            torch.cuda.synchronize()
        events = prof.key_averages()
        if len(events) > 5:
            head = "graph replay" if replay else "eager step (the profiler saw no kernels inside the graph replay)"
            return head + "\n" + events.table(sort_by="cuda_time_total", row_limit=20)
    return "no kernels recorded"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL, help="a known config (models/known_configs.py)")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the config's (default: all)")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--kv-cache-dtype", default="auto", help="the engine's flag (fp8_e4m3: half the K/V bytes)")
    ap.add_argument("--mamba-ssm-dtype", default=None, help="the engine's flag (bfloat16: half the GDN state bytes)")
    cli = ap.parse_args()
    batches = [int(b) for b in cli.batches.split(",")]
    contexts = [int(c) for c in cli.contexts.split(",")]
    torch.manual_seed(0)
    copy = copy_tbps()
    root = tempfile.mkdtemp()
    path = config_dir(cli.model, fp8=True, root=root)
    if cli.layers is not None:
        cfg_file = os.path.join(path, "config.json")
        raw = json.load(open(cfg_file))
        raw["text_config"]["num_hidden_layers"] = cli.layers
        raw["text_config"].pop("layer_types", None)
        json.dump(raw, open(cfg_file, "w"))
    context_cap = max(contexts) + 64
    plan = plan_bytes(EngineArgs(path, load_format="dummy", context_length=context_cap, max_running_requests=1,
                                 kv_cache_dtype=cli.kv_cache_dtype, mamba_ssm_dtype=cli.mamba_ssm_dtype))
    torch.cuda.empty_cache()  # the copy's buffers: free for the engine, so count them as free
    free, total = torch.cuda.mem_get_info()
    budget = free - plan.weights - RESERVE
    # Every batch gets its state slots; K/V pages fill what is left, so small contexts run the
    # largest batch even where the longest context cannot.
    max_running = max(batches)
    num_pages = min(max_running * plan.pages_per_request, (budget - (max_running + 1) * plan.state_per_slot) // plan.page)
    print(f"{torch.cuda.get_device_name()}; copy {copy:.2f} TB/s; weights {plan.weights / GIB:.1f} GiB, free "
          f"{free / GIB:.1f} of {total / GIB:.1f} GiB; {plan.per_request / 2**20:.0f} MiB per request at {context_cap} "
          f"tokens; {max_running} slots, {num_pages} pages of 64 tokens")
    if num_pages < plan.pages_per_request:
        raise SystemExit("the weights leave no room for one request at the longest context; use fewer --layers")
    engine = Engine(resolve_plan(EngineArgs(path, load_format="dummy", context_length=context_cap, page_size=64,
                               max_running_requests=max_running, num_pages=int(num_pages),
                               cuda_graph_max_bs=max_running, kv_cache_dtype=cli.kv_cache_dtype,
                               mamba_ssm_dtype=cli.mamba_ssm_dtype)))
    pool = engine.pool
    for cache in (pool.kv.k, pool.kv.v):  # random K/V, as the cache holds them: attention is not timed on zeros
        for rows in cache.flatten(0, 1).split(1 << 16):  # FP8 has no normal_: cast from a bounded temporary
            rows.copy_(cache_values(torch.randn(rows.shape, device=rows.device), rows.dtype))
    torch.cuda.empty_cache()
    free_after = torch.cuda.mem_get_info()[0]
    left = free_after + pool.kv.nbytes + pool.state.nbytes
    memory = {"weights GiB": plan.weights / GIB, "left for KV/state after loading GiB": left / GIB,
              "per request MiB": plan.per_request / 2**20,
              # an upper bound: every free byte to slots and pages, none to activations (the server's
              # planner reserves its largest steps' first, engine/device_memory.py)
              f"max batch at {context_cap} tokens, no activations": int(left // plan.per_request),
              "graph buckets": str(engine.graph_runner.buckets if engine.graph_runner else None)}
    print(table([memory], f"{cli.model} FP8, {engine.config.num_layers} layers, memory"))
    rows, prof = [], ""
    for context in contexts:
        cap = min(pool.free_slots, pool.available_pages // _num_pages(context + 1, 64))
        fits = [b for b in batches if b <= cap]
        if cap < max(batches) and cap >= 8:
            fits.append(cap // 8 * 8)  # also the largest graph bucket that fits at this context
        for b in sorted(set(batches) | set(fits)):
            if b not in fits:
                rows.append({"context": context, "B": b, "step ms": "does not fit"})
                continue
            batch, slots = decode_batch(engine, b, context)
            for s in slots:
                pool.state.ssm[:, s].normal_(std=0.1)  # a live recurrent state, not zeros
            touched = touched_experts(engine, batch)
            ms = time_steps(engine, batch)
            nbytes = step_bytes(engine, touched, b, context)
            roof_ms = sum(nbytes.values()) / (copy * 1e9)
            rows.append({"context": context, "B": b, "step ms": ms, "tokens/s": b / ms * 1e3,
                         "experts/layer": sum(touched) / len(touched), "GB read": sum(nbytes.values()) / 1e9,
                         **{f"{k} GB": v / 1e9 for k, v in nbytes.items()},
                         "roofline ms": roof_ms, "vs roofline": roof_ms / ms})
            print(rows[-1])  # as it is measured: a later failure keeps it
            if context == max(contexts) and b == max(fits):
                prof = profile_step(engine, batch)
            for s in slots:
                pool.free(s)
    print(table(rows, f"Decode steps, CUDA graphs (copy {copy:.2f} TB/s)"))
    print(prof)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_decode.json"), "w") as f:
            json.dump({"copy_tbps": copy, "memory": memory, "rows": rows, "profile": prof}, f, indent=1)


if __name__ == "__main__":
    main()
