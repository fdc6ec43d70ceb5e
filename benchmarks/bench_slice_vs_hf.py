"""A 4-layer slice of Qwen3.5-122B-A10B (3 GDN + 1 full attention, real shapes, bf16, seeded random
weights) on one GPU: our decode step (Triton backends + CUDA graphs) at B=1 and B=32 after a
512-token prompt, next to HF transformers' Qwen3_5MoeForCausalLM on the same config in the same
run; and the greedy tokens of our Triton + graph path against our torch backends on the same weights.

    python benchmarks/bench_slice_vs_hf.py [--batches 1,32] [--prompt 512] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.models.known_configs import hf_config

KERNELS = dict(attention_backend="triton", gdn_backend="triton", moe_backend="triton")


def slice_config(layers: int = 4) -> dict:
    raw = hf_config("Qwen3.5-122B-A10B")
    text = raw["text_config"]
    text["num_hidden_layers"] = layers
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return raw


def cuda_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ours_step_ms(engine: Engine, batch: int, prompt: int) -> float:
    pool = engine.pool
    slots = [pool.allocate(prompt + 64) for _ in range(batch)]
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 1000, (prompt,), generator=g).tolist() for _ in range(batch)]
    for s in slots:
        pool.ensure_tokens(s, prompt + 1)
    engine.forward_batch(engine.make_batch(ids, [0] * batch, slots))
    step = engine.make_batch([[5]] * batch, [prompt] * batch, slots)
    for _ in range(3):
        engine.forward_batch(step)
    ms = cuda_ms(lambda: engine.forward_batch(step), 20)
    for s in slots:
        pool.free(s)
    return ms


def hf_step_ms(raw: dict, batch: int, prompt: int) -> float:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(**{k: v for k, v in raw["text_config"].items() if k != "model_type"})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3_5MoeForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 1000, (batch, prompt), device="cuda")
    with torch.no_grad():
        out = model(ids, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        # transformers renamed past_key_values to cache (5.2x); the old keyword still maps to it.
        cache = getattr(out, "cache", None) or out.past_key_values

        def step() -> None:
            model(nxt, past_key_values=cache, use_cache=True)

        ms = cuda_ms(step, 5)  # each call appends one position to the cache: a few steps only
    del model, cache, out
    torch.cuda.empty_cache()
    return ms


def greedy_agreement(model_dir: str, steps: int = 16) -> float:
    """Share of greedy tokens our Triton + graph path and our torch backends agree on."""
    common = dict(model_path=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", context_length=1024,
                  max_running_requests=4, cuda_graph_max_bs=4)
    from minisgl.scheduler.scheduler import Scheduler
    from minisgl.sampling_params import SamplingParams
    from minisgl.scheduler.messages import GenerateRequest

    g = torch.Generator().manual_seed(1)
    prompts = [tuple(torch.randint(0, 1000, (n,), generator=g).tolist()) for n in (7, 64, 200, 513)]
    tokens = []
    for kw in (KERNELS, dict(attention_backend="torch", gdn_backend="torch", moe_backend="torch")):
        sched = Scheduler(Engine(resolve_plan(EngineArgs(**common, **kw))))
        params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(f"r{i}", p, params))
        got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        while sched.has_work:
            for out in sched.step():
                got[out.rid].extend(out.new_token_ids)
        tokens.append(got)
        del sched
        torch.cuda.empty_cache()
    ours, ref = tokens
    same = sum(a == b for rid in ours for a, b in zip(ours[rid], ref[rid]))
    return same / sum(len(v) for v in ref.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--json")
    ns = ap.parse_args()
    raw = slice_config()
    batches = [int(b) for b in ns.batches.split(",")]
    result: dict = {"device": torch.cuda.get_device_name(), "prompt": ns.prompt, "rows": []}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(raw, f)
        engine = Engine(resolve_plan(EngineArgs(model_path=d, load_format="dummy", dtype="bfloat16", device="cuda",
                                   context_length=ns.prompt + 64, max_running_requests=max(batches),
                                   cuda_graph_max_bs=max(batches), **KERNELS)))
        assert engine.graph_runner is not None, "decode graphs were not captured"
        ours = {b: ours_step_ms(engine, b, ns.prompt) for b in batches}
        del engine
        torch.cuda.empty_cache()
        result["greedy_agreement_triton_graphs_vs_torch"] = greedy_agreement(d)
    for b in batches:
        hf = hf_step_ms(raw, b, ns.prompt)
        result["rows"].append({"batch": b, "ours_ms": ours[b], "hf_ms": hf, "speedup": hf / ours[b]})
    print(f"4-layer Qwen3.5-122B slice, bf16, decode after {ns.prompt} tokens, {result['device']}")
    print(f"{'B':>4} {'ours ms':>9} {'HF ms':>9} {'HF/ours':>8}")
    for r in result["rows"]:
        print(f"{r['batch']:>4} {r['ours_ms']:>9.3f} {r['hf_ms']:>9.2f} {r['speedup']:>8.1f}")
    print(f"greedy tokens, triton+graphs vs torch backends: {result['greedy_agreement_triton_graphs_vs_torch']:.4f}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
