"""Per-layer decode times of the model on one device, at real shapes with random weights: what the
AFD pipeline simulator needs to predict a step (`python -m minisgl.tools.pipeline --measured FILE`).

- T_a(GDN), T_a(full): one decoder layer's norms, mixer and router for a decode batch of `batch`
  requests at `context` tokens each (the attention worker's work before the dispatch is sent);
- shared: the gated shared expert (after the send); head: embeddings; tail: final norm and lm_head;
- T_e: one expert worker's routed experts (E/N of them, --expert-workers N) over `tokens` rows
  routed top-k over all E experts, the way an expert worker receives them.

    python benchmarks/bench_layer_times.py --model qwen35-122b [--fp8] [--contexts 1024,4096,8192,16384,32768]
        [--batches 8,16,32,64,128] [--tokens 16,32,64,128,256,512,1024] [--expert-workers 4]
        [--attention-backend auto --gdn-backend auto --moe-backend auto] [--eager] [--out layer_times.json]
    python benchmarks/bench_layer_times.py --model tiny --contexts 256,1024 --batches 4,16 --tokens 8,32  # CPU

Weights are `--load-format dummy`'s (seeded, FP8 codes plus block scales with --fp8, as the FP8
checkpoints hold them on the GPU). On a GPU each piece is captured in a CUDA graph and the replays
timed with CUDA events (median of --reps after warm-up): kernel time, as a graph-replayed worker
would spend it; --eager times the eager calls instead, host launch cost included. The monotonic
clock on the CPU. Writes the JSON to --out, or to $OUT/layer_times.json when $OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from minisgl.afd.expert_stage import ExpertStage
from minisgl.engine.plan import BackendNames, fp8_storage
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig
from minisgl.layers.linear import Linear
from minisgl.models.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.materialize import build_module
from minisgl.models.qwen3_5_moe import Qwen3_5MoeForCausalLM
from minisgl.models.sharding import pool_layout
from minisgl.moe.block import SharedExpert
from minisgl.moe.router import route
from minisgl.tools.pipeline.cli import model_config


def time_us(fn: Callable[[], object], device: torch.device, reps: int, graph: bool) -> float:
    for _ in range(3):
        fn()
    if graph:
        torch.cuda.synchronize()
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        fn = captured.replay
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def randomize(module: nn.Module) -> nn.Module:
    """`--load-format dummy`'s weights: finite activations, and routing that spreads the tokens."""
    init_dummy_weights(module, seed=0)
    return module


def one_of_each(config: ModelConfig) -> ModelConfig:
    """The first GDN and first full-attention layer only: layers [0, first full]."""
    end = config.layer_types.index(FULL_ATTENTION) + 1
    return replace(config, num_layers=end, layer_types=config.layer_types[:end])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen35-122b")
    ap.add_argument("--contexts", default="1024,4096,8192,16384,32768")
    ap.add_argument("--batches", default="8,16,32,64,128", help="requests per micro-batch")
    ap.add_argument("--tokens", default="16,32,64,128,256,512,1024", help="rows reaching one expert worker")
    ap.add_argument("--expert-workers", type=int, default=4)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--gdn-backend", default="auto")
    ap.add_argument("--moe-backend", default="auto")
    ap.add_argument("--fp8", action="store_true", help="the FP8 checkpoint's layout (GPU only)")
    ap.add_argument("--eager", action="store_true", help="time eager calls, not CUDA-graph replays")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    ns = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    if not gpu:
        torch.set_num_threads(1)
    config = one_of_each(model_config(ns.model, ns.fp8))
    fp8 = fp8_storage(config, device)
    if ns.fp8 and fp8 is None:
        raise SystemExit("--fp8 needs a GPU (the CPU path dequantises FP8 weights)")
    if config.num_experts % ns.expert_workers:
        raise SystemExit(f"{config.num_experts} experts do not split over {ns.expert_workers} expert workers")
    backends = BackendNames.resolve(ns.attention_backend, ns.gdn_backend, ns.moe_backend, device).build()
    h, E = config.hidden_size, config.num_experts
    model = randomize(
        build_module(lambda: Qwen3_5MoeForCausalLM(config, backends, lambda i: nn.Identity()), dtype, device, fp8)
    )
    router = randomize(build_module(lambda: Linear(h, E), dtype, device))
    shared = randomize(build_module(lambda: SharedExpert(h, config.shared_expert_intermediate_size), dtype, device, fp8))
    shared_gate = randomize(build_module(lambda: Linear(h, 1), dtype, device))
    gdn = model.layers[config.layer_types.index(LINEAR_ATTENTION)]
    full = model.layers[config.layer_types.index(FULL_ATTENTION)]
    graphs = gpu and not ns.eager
    t = lambda fn: round(time_us(fn, device, ns.reps, graphs), 1)  # noqa: E731
    out: dict = dict(model=ns.model, device=torch.cuda.get_device_name() if gpu else "cpu", dtype=str(dtype),
                     fp8=fp8 is not None, timing="cuda graph replay" if graphs else "eager",
                     torch=torch.__version__, expert_workers=ns.expert_workers, attn={"gdn": [], "full": []},
                     shared=[], head=[], tail=[], expert=[])

    batches = [int(b) for b in ns.batches.split(",")]
    print(f"{'batch':>6} {'context':>8} {'T_a gdn us':>11} {'T_a full us':>12}")
    with torch.inference_mode():
        for b in batches:
            for c in (int(x) for x in ns.contexts.split(",")):
                pool = HybridPool(pool_layout(config), PoolConfig(b, c + 1, 64), dtype, device)
                slots = [pool.allocate(c + 1) for _ in range(b)]
                for s in slots:
                    pool.ensure_tokens(s, c + 1)
                batch = ForwardBatch.build([[1]] * b, [c] * b, slots, pool.page_table, pool.page_size, device)
                x, ctx = model.embed(batch, pool)
                pre = lambda layer: route(router(layer.mixer_half(x, ctx)[1]), config.top_k, config.norm_topk_prob)  # noqa: E731
                row = (t(lambda: pre(gdn)), t(lambda: pre(full)))
                out["attn"]["gdn"].append([b, c, row[0]])
                out["attn"]["full"].append([b, c, row[1]])
                print(f"{b:>6} {c:>8} {row[0]:>11} {row[1]:>12}", flush=True)
                del pool, x, ctx
            y = torch.randn(b, h, dtype=dtype, device=device)
            out["shared"].append([b, t(lambda: torch.sigmoid(shared_gate(y)) * shared(y))])
            out["tail"].append([b, t(lambda: model.logits(y, batch))])
            out["head"].append([b, t(lambda: model.embed_tokens(batch.input_ids))])
        count = E // ns.expert_workers
        stage = randomize(build_module(lambda: ExpertStage(config, 0, count, backends.moe), dtype, device, fp8))
        print(f"\nT_e: one expert worker, experts [0, {count}) of {E}, top-{config.top_k}")
        for n in (int(x) for x in ns.tokens.split(",")):
            xs = torch.randn(n, h, dtype=dtype, device=device)
            ids = torch.rand(n, E, device=device).topk(config.top_k, dim=-1).indices
            weights = torch.full((n, config.top_k), 1 / config.top_k, device=device)
            out["expert"].append([n, t(lambda: stage(xs, ids, weights))])
            print(f"  {n:>6} tokens: {out['expert'][-1][1]} us", flush=True)
    print("\nshared / tail us per batch:", out["shared"], out["tail"])
    path = ns.out or (os.path.join(os.environ["OUT"], "layer_times.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
