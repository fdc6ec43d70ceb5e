"""The FP8 projections of one decode step at serving batch sizes: which GEMM to run at each token count.

    python benchmarks/bench_decode_linear.py [--model Qwen3.5-35B-A3B] [--tokens 32,64,128,200,256,384]

For every FP8 projection shape of the --model config (known_configs.py) and every token count, each
candidate (what kernels/fp8_linear.py's REGIMES pick; its backends: the split-K kernel with its
own and other tiles, cuBLAS block scaling, the tiled kernel) runs through fp8_linear, the activation
quantiser included as served, captured in one CUDA graph over enough weight copies that every call
reads its weight from HBM (gpu_timing.graph_us): the device time of a decode step's replay. Each
candidate's output is first checked against the regime's (relative to the largest output).
The split-K kernel's own tile is what REGIMES ran at every decode size until 2026-12-04.

Per token count it prints the step's projection time per candidate (each shape's time times its
calls per step: GDN layers x 3, attention layers x 4, every layer x 2 for the shared expert, whose
gate and up run stacked) beside the weight bytes' time at the copy bandwidth measured in the same
run. Writes bench_decode_linear_MODEL.json under $OUT when set.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch

from gpu_timing import copy_tbps, graph_us, table
from minisgl.kernels.fp8_gemm_tiled import TileConfig
from minisgl.kernels.fp8_linear import fp8_linear, regime
from minisgl.layers.fp8 import quantize_block_fp8
from minisgl.models.config import ModelConfig, parse_config
from minisgl.models.known_configs import hf_config

DEV = "cuda"
L2_ROTATION_BYTES = 256 << 20  # weight copies per graph: together 5x the H200's 50 MB L2
MAX_REL_ERR = 0.02  # FP8 outputs of different summation orders, bf16-rounded, against the largest output

# name -> fp8_linear's options. The split-K kernel's token block (block_m) and weight rows (block_n)
# beyond the regime's: one program may hold every token of a decode batch, reading its weights once.
CANDIDATES: dict[str, dict[str, object]] = {
    "regime": {},
    "split_k": {"backend": "split_k"},
    "split_k bm128 bn64 w4 s4": {"backend": "split_k", "block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 4},
    "split_k bm128 bn128 w8 s3": {"backend": "split_k", "block_m": 128, "block_n": 128, "num_warps": 8,
                                  "num_stages": 3},
    "split_k bm256 bn64 w4 s3": {"backend": "split_k", "block_m": 256, "block_n": 64, "num_warps": 4, "num_stages": 3},
    "split_k bm256 bn64 w8 s3": {"backend": "split_k", "block_m": 256, "block_n": 64, "num_warps": 8, "num_stages": 3},
    "split_k bm64 bn128 w8 s4": {"backend": "split_k", "block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 4},
    "cublas": {"backend": "cublas"},
    "tiled 64x128 w4 s4 tma": {"backend": "tiled", "tile": TileConfig(64, 128, 4, 4, tma=True)},
}


def projections(config: ModelConfig) -> list[tuple[str, int, int, int]]:
    """(name, N, K, calls per decode step) of the config's FP8 projections, as the model runs them:
    the shared expert's gate and up as one GEMM where they stack in whole 128-row blocks
    (layers/row_stack.py)."""
    h, gdn, attn = config.hidden_size, len(config.linear_layers), len(config.full_layers)
    q_rows = config.num_heads * config.head_dim * (2 if config.attn_output_gate else 1)
    shared = config.shared_expert_intermediate_size
    gate_up = ([("shared gate_proj + up_proj (stacked)", 2 * shared, h, config.num_layers)] if shared % 128 == 0
               else [("shared gate_proj, up_proj", shared, h, 2 * config.num_layers)])
    return [
        ("gdn in_proj_qkv", config.conv_dim, h, gdn), ("gdn in_proj_z", config.linear_value_dim, h, gdn),
        ("gdn out_proj", h, config.linear_value_dim, gdn), ("attn q_proj", q_rows, h, attn),
        ("attn k_proj, v_proj", config.num_kv_heads * config.head_dim, h, 2 * attn),
        ("attn o_proj", h, config.num_heads * config.head_dim, attn),
        *gate_up, ("shared down_proj", h, shared, config.num_layers),
    ]


def rows_for(name: str, n: int, k: int, calls: int, tokens: list[int], copy: float) -> list[dict[str, object]]:
    w, s = quantize_block_fp8(torch.randn(n, k, device=DEV) / k**0.5)
    nbytes = w.numel() + s.numel() * 4
    copies = [(w.clone(), s.clone()) for _ in range(-(-L2_ROTATION_BYTES // nbytes))]
    rows = []
    for m in tokens:
        x = torch.randn(m, k, dtype=torch.bfloat16, device=DEV)
        ref = fp8_linear(x, w, s).float()
        row: dict[str, object] = {"linear": name, "N": n, "K": k, "M": m, "calls": calls,
                                  "regime's backend": regime(m).backend_for(k), "HBM floor us": nbytes / copy / 1e6}
        for cand, opts in CANDIDATES.items():
            run: Callable[..., torch.Tensor] = lambda w, s, opts=opts: fp8_linear(x, w, s, **opts)  # noqa: E731
            try:
                err = ((run(w, s).float() - ref).abs().max() / ref.abs().max()).item()
                if err > MAX_REL_ERR:
                    row[cand] = f"wrong: {err:.3g}"
                    continue
                row[cand] = graph_us([lambda w=w, s=s, run=run: run(w, s) for w, s in copies])
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
                row[cand] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        rows.append(row)
        print(row)
    return rows


def step_totals(rows: list[dict[str, object]], tokens: list[int], copy: float) -> list[dict[str, object]]:
    """Per token count: each candidate's projection time of one decode step (ms), where it ran every shape."""
    out = []
    for m in tokens:
        mine = [r for r in rows if r["M"] == m]
        floor = sum(r["HBM floor us"] * r["calls"] for r in mine) / 1e3
        total: dict[str, object] = {"M": m, "HBM floor ms": floor}
        for cand in CANDIDATES:
            times = [r[cand] for r in mine]
            if all(isinstance(t, float) for t in times):
                total[f"{cand} ms"] = sum(t * r["calls"] for t, r in zip(times, mine)) / 1e3
        best = min((v, k) for k, v in total.items() if k.endswith(" ms") and k != "HBM floor ms")
        total["fastest"] = best[1][:-3]
        total["fastest vs regime"] = total["regime ms"] / best[0] if "regime ms" in total else "-"
        # the best per shape: what a per-shape choice would give
        total["best per shape ms"] = sum(min(t for t in (r[c] for c in CANDIDATES) if isinstance(t, float)) * r["calls"]
                                         for r in mine) / 1e3
        out.append(total)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Qwen3.5-35B-A3B", help="a known config (models/known_configs.py)")
    ap.add_argument("--tokens", default="32,64,128,200,256,384")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    torch.manual_seed(0)
    config = parse_config(hf_config(args.model, fp8=True))
    copy = copy_tbps()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {copy:.2f} TB/s; {args.model}")
    rows: list[dict[str, object]] = []
    for name, n, k, calls in projections(config):
        rows += rows_for(name, n, k, calls, tokens, copy)
    totals = step_totals(rows, tokens, copy)
    print(table(rows, f"{args.model} FP8 projections, us a call (CUDA graphs, cold weights, quantiser included)"))
    print(table(totals, f"{args.model}: the projections of one decode step, ms (copy {copy:.2f} TB/s)"))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"bench_decode_linear_{args.model}.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy TB/s": copy, "rows": rows, "totals": totals},
                      f, indent=1, default=str)


if __name__ == "__main__":
    main()
