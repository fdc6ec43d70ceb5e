"""Prefill at Qwen3.5-122B-A10B FP8 shapes against the FP8 matrix ceiling measured in the same run.

    python benchmarks/bench_prefill.py [--tokens 512,4096,16384] [--moe-tokens 1024,4096,16384]
        [--model Qwen3.5-122B-A10B] [--layers N] [--steps 16x1024,2x8192,1x8192@24576]
        [--skip-model] [--skip-kernels] [--moe-only]

Prints, in one run:
- the ceilings: torch._scaled_mm at 8192^3 with rowwise scales (the FP8 matrix ceiling every
  TFLOP/s below is a ratio of), BF16 cuBLAS at 8192^3 for context, and a device copy (for the
  activation quantiser, which is bound by bytes);
- the activation quantiser at M x 3072 against the copy;
- every FP8 projection shape (kernels/fp8_linear.py's backends: split-K, each candidate tile of the
  tiled kernel with and without TMA, cuBLAS block scaling), GEMM alone on quantised activations, and
  which backend wins at each token count: the rows REGIMES should hold;
- the fused MoE at prefill sizes, uniform and skewed routing: the align, and every candidate
  (MOE_CANDIDATES: decode's tokens-narrow kernels, with wider tiles, and the large-M kernels) for
  gate/up + SwiGLU and down against the ceiling and against their roofline (the longer of the
  FLOPs at the ceiling and the used experts' weights read once at the copy rate), checked against
  each other; --moe-only runs just this after the ceilings (benchmarks/moe_session.sh);
- whole prefill steps of the engine (prefill_steps.py) (`--load-format dummy`, the --model config
  with --layers layers if given, Triton/fla backends; a step BxN@P runs after P cached tokens, as a
  long prompt's later chunks do): tokens/s and the ratio to the FLOP roofline (GEMM FLOPs of every
  projection, expert and router, plus causal attention; the GDN recurrence is not counted), and a
  torch.profiler table of the top kernels of one step;
- decode steps of the same engine in CUDA graphs at 1K context (--decode-batches), timed and
  rooflined by bench_decode.py's functions: the check that decode did not regress.
Writes bench_prefill.json under $OUT when set, as it goes. Candidates that fail are reported and
skipped. The summary table comes last.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import traceback
from collections.abc import Callable
from functools import partial

import torch

from bench_moe import fp8_experts
from gpu_timing import copy_tbps, graph_us, median_us, table
from prefill_steps import MODEL, PrefillStep, model_rows
from minisgl.kernels.fp8_gemm import gemm_split_k
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE, cublas_block_scaling, cublas_fits, gemm_cublas
from minisgl.kernels.fp8_gemm_tiled import TileConfig, gemm_tiled
from minisgl.kernels.fp8_linear import REGIMES, fp8_linear, regime
from minisgl.kernels.fp8_quant import quantize_activations
from minisgl.kernels.moe_align import align_experts
from minisgl.kernels.moe_gemm import moe_combine, moe_down, moe_gate_up, rows_bucket
from minisgl.kernels.moe_gemm import regime as moe_regime
from minisgl.layers.fp8 import FP8_DTYPE, cdiv, quantize_block_fp8

DEV = "cuda"
H, I, E, TOP_K = 3072, 1024, 256, 8  # bench_moe.fp8_experts' shapes
# (name, N, K) of the 122B FP8 projections a prefill step runs.
LINEARS = [
    ("gdn in_proj_qkv", 12288, 3072), ("gdn in_proj_z", 8192, 3072), ("attn q_proj", 16384, 3072),
    ("attn k/v_proj", 512, 3072), ("out_proj / o_proj", 3072, 8192), ("shared gate/up", 1024, 3072),
    ("shared down", 3072, 1024),
]
TILE_CANDIDATES = [  # REGIMES' tiles first; then TMA variants and wider tiles
    TileConfig(64, 128, 4, 4), TileConfig(128, 128, 8, 3), TileConfig(64, 128, 4, 4, tma=True),
    TileConfig(128, 128, 8, 4, tma=True), TileConfig(128, 128, 4, 4, tma=True), TileConfig(128, 256, 8, 3, tma=True),
]
# name -> (rows per block, or None for the regime's; gate_up override; down override): the fused MoE's
# candidates at prefill sizes. "decode kernels" are the tokens-narrow kernels (the table before the
# large-M regime: 64/128 columns, 8 warps at 128 rows), then with wider tiles; "large" the large-M
# kernels (BLOCK_M x gate_up's columns per half, q: h quantised in gate_up's epilogue, 64x2q: by two
# 64-column halves a program / down's columns;
# tma: FP8 operands through TMA, else pointer loads).
def _narrow(bn: int, warps: int, stages: int) -> dict[str, object]:
    return dict(large_m=False, block_n=bn, num_warps=warps, num_stages=stages)


def _large(bn: int, warps: int, stages: int, group_m: int = 8, tma: bool = False,
           halves: bool = False) -> dict[str, object]:
    return dict(large_m=True, block_n=bn, num_warps=warps, num_stages=stages, group_m=group_m, tma=tma,
                codes_in_halves=halves)


MOE_CANDIDATES = {
    "regime (REGIMES now)": (None, {}, {}),
    "decode kernels, 128 rows (as before)": (128, _narrow(64, 8, 3), _narrow(128, 8, 3)),
    "decode kernels 128 w8 s4": (128, _narrow(128, 8, 4), _narrow(128, 8, 4)),
    "decode kernels 128/256 w8 s3": (128, _narrow(128, 8, 3), _narrow(256, 8, 3)),
    "large 64: 64/128 w4 s3": (64, _large(64, 4, 3), _large(128, 4, 3)),
    "large 64: 64/128 w4 s4": (64, _large(64, 4, 4), _large(128, 4, 4)),
    "large 64: 64/128 w4 s5": (64, _large(64, 4, 5), _large(128, 4, 5)),
    "large 64: 64/128 w4 s4 group 16": (64, _large(64, 4, 4, 16), _large(128, 4, 4, 16)),
    "large 64: 64/128 w4 s4 group 32": (64, _large(64, 4, 4, 32), _large(128, 4, 4, 32)),
    "large 64: 64/256 w8 s4": (64, _large(64, 4, 4), _large(256, 8, 4)),
    "large 128: 64/128 w8 s3": (128, _large(64, 8, 3), _large(128, 8, 3)),
    "large 64: 128q/128 w4 s3": (64, _large(128, 4, 3), _large(128, 4, 3)),
    "large 64: 128q/256 w8 s3": (64, _large(128, 8, 3), _large(256, 8, 3)),
    "large 128: 64/128 w8 s4": (128, _large(64, 8, 4), _large(128, 8, 4)),
    "large 128: 128q/128 w8 s3": (128, _large(128, 8, 3), _large(128, 8, 3)),
    "large 128: 128q/256 w8 s3": (128, _large(128, 8, 3), _large(256, 8, 3)),
    "large 128: 128q/128 w8 s3 group 1": (128, _large(128, 8, 3, 1), _large(128, 8, 3, 1)),
    "large 64: 64/128 w4 s3 tma": (64, _large(64, 4, 3, tma=True), _large(128, 4, 3, tma=True)),
    "large 64: 64/128 w4 s4 tma": (64, _large(64, 4, 4, tma=True), _large(128, 4, 4, tma=True)),
    "large 64: 64/128 w4 s5 tma": (64, _large(64, 4, 5, tma=True), _large(128, 4, 5, tma=True)),
    "large 64: 64/128 w4 s3 group 16 tma": (64, _large(64, 4, 3, 16, tma=True), _large(128, 4, 3, 16, tma=True)),
    "large 64: 64/128 w4 s3 group 4 tma": (64, _large(64, 4, 3, 4, tma=True), _large(128, 4, 3, 4, tma=True)),
    "large 64: 64x2q/128 w4 s3 tma": (64, _large(64, 4, 3, tma=True, halves=True), _large(128, 4, 3, tma=True)),
    "large 64: 64x2q/128 w4 s4 tma": (64, _large(64, 4, 4, tma=True, halves=True), _large(128, 4, 3, tma=True)),
    "large 64: 128q/128 w4 s3 tma": (64, _large(128, 4, 3, tma=True), _large(128, 4, 3, tma=True)),
    "large 64: 128q/128 w8 s3 tma": (64, _large(128, 8, 3, tma=True), _large(128, 8, 3, tma=True)),
    "large 128: 64/128 w8 s3 tma": (128, _large(64, 8, 3, tma=True), _large(128, 8, 3, tma=True)),
    "large 128: 128q/128 w8 s3 tma": (128, _large(128, 8, 3, tma=True), _large(128, 8, 3, tma=True)),
    "large 128: 128q/128 w8 s4 tma": (128, _large(128, 8, 4, tma=True), _large(128, 8, 4, tma=True)),
}


def tflops(flops: float, us: float) -> float:
    return flops / us / 1e6


def attempt(what: str, fn: Callable[[], float]) -> float | str:
    """fn()'s time, or why it failed (a candidate that does not compile or run is reported, not fatal)."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        print(f"  {what}: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
        return f"fails: {type(err).__name__}"


def ceilings() -> dict[str, float]:
    n = 8192
    a = torch.randn(n, n, device=DEV).to(FP8_DTYPE)
    b = torch.randn(n, n, device=DEV).to(FP8_DTYPE).t()  # column-major, as cuBLAS wants
    sa, sb = torch.rand(n, 1, device=DEV).add(0.5), torch.rand(1, n, device=DEV).add(0.5)
    fp8_us = median_us(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    a16, b16 = torch.randn(n, n, device=DEV, dtype=torch.bfloat16), torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    bf16_us = median_us(lambda: a16 @ b16)
    return {"fp8 rowwise _scaled_mm 8192^3 TFLOP/s": tflops(2 * n**3, fp8_us),
            "bf16 cuBLAS 8192^3 TFLOP/s": tflops(2 * n**3, bf16_us), "copy TB/s": copy_tbps()}


def quantiser_rows(tokens: list[int], copy: float) -> list[dict[str, object]]:
    rows = []
    for m in tokens:
        x = torch.randn(m, H, device=DEV, dtype=torch.bfloat16)
        us = median_us(lambda: quantize_activations(x))
        nbytes = m * H * (2 + 1) + m * cdiv(H, 128) * 4
        rows.append({"M": m, "K": H, "quantise us": us, "TB/s": nbytes / us / 1e6, "vs copy": nbytes / us / 1e6 / copy})
    return rows


def linear_candidates(xq, xs, w, s) -> dict[str, Callable[[], object]]:  # noqa: ANN001
    out = {"split_k": lambda: gemm_split_k(xq, xs, w, s, torch.bfloat16)}
    for tile in TILE_CANDIDATES:
        out[tile_name(tile)] = lambda tile=tile: gemm_tiled(xq, xs, w, s, torch.bfloat16, tile)
    if xq.shape[0] % ROWS_MULTIPLE == 0 and cublas_fits(w, s) and cublas_block_scaling(torch.device(DEV)) is None:
        out["cublas"] = lambda: gemm_cublas(xq, xs, w, s, torch.bfloat16)
    return out


def tile_name(tile: TileConfig) -> str:
    return f"tiled {tile.block_m}x{tile.block_n} w{tile.num_warps} s{tile.num_stages}{' tma' if tile.tma else ''}"


def linear_rows(tokens: list[int], ceiling: float) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Every candidate on every shape and token count (GEMM alone), then the winners per token count."""
    rows, totals = [], {}
    for name, n, k in LINEARS:
        w, s = quantize_block_fp8(torch.randn(n, k, device=DEV) / k**0.5)
        for m in tokens:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            xq, xs = quantize_activations(x)
            row: dict[str, object] = {"linear": name, "N": n, "K": k, "M": m, "regime": regime_name(m)}
            best = None
            for cand, fn in linear_candidates(xq, xs, w, s).items():
                us = attempt(f"{name} M={m} {cand}", lambda fn=fn: median_us(fn))
                if isinstance(us, float):
                    totals.setdefault(m, {}).setdefault(cand, []).append(us)
                    best = min(best or (us, cand), (us, cand))
                row[f"{cand} TFLOP/s"] = tflops(2 * m * n * k, us) if isinstance(us, float) else us
            regime_us = median_us(lambda: fp8_linear(x, w, s))
            row["fp8_linear (regime, with quantiser) TFLOP/s"] = tflops(2 * m * n * k, regime_us)
            row["fp8_linear vs ceiling"] = tflops(2 * m * n * k, regime_us) / ceiling
            if best:
                row["best"] = best[1]
                row["best vs ceiling"] = tflops(2 * m * n * k, best[0]) / ceiling
            rows.append(row)
            print({k: v for k, v in row.items() if "TFLOP" not in k or "regime" in k})
    winners = []
    for m, per in sorted(totals.items()):
        complete = {c: sum(v) for c, v in per.items() if len(v) == len(LINEARS)}  # ran on every shape
        if complete:
            best = min(complete, key=complete.get)
            flops = sum(2 * m * n * k for _, n, k in LINEARS)
            winners.append({"M": m, "fastest over all shapes": best, "its TFLOP/s": tflops(flops, complete[best]),
                            "vs ceiling": tflops(flops, complete[best]) / ceiling, "regime now": regime_name(m),
                            "regime TFLOP/s": tflops(flops, complete.get(regime_key(m), float("nan")))})
    return rows, winners


def regime_name(m: int) -> str:
    r = regime(m)
    return r.backend if r.backend == "split_k" or r.tile is None else f"{r.backend}: {tile_name(r.tile)}"


def regime_key(m: int) -> str:
    r = regime(m)
    return "split_k" if r.backend == "split_k" else "cublas" if r.backend == "cublas" else tile_name(r.tile)


def moe_routing(t: int, skewed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-8 of 256 per token: uniform, or skewed (expert popularity ~ 1 / rank, drawn without
    replacement: the hottest expert gets ~60% of the tokens, the coldest ~2%)."""
    if skewed:
        p = 1.0 / torch.arange(1, E + 1, device=DEV, dtype=torch.float32)
        ids = torch.multinomial(p[torch.randperm(E, device=DEV)].expand(t, E), TOP_K)
    else:
        ids = torch.rand(t, E, device=DEV).topk(TOP_K, dim=-1).indices
    return ids, torch.rand(t, TOP_K, device=DEV).softmax(-1).to(torch.bfloat16)


def expert_weight_bytes(w: dict[str, torch.Tensor], stage: str, used: int) -> int:
    """Bytes of one stage's weights and block scales over `used` experts: what a grouped GEMM must read
    at least once however it tiles."""
    return used * sum(t[0].numel() * t.element_size() for t in (w[stage], w[f"{stage}_scale"]))


def moe_rows(tokens: list[int], ceiling: float, copy: float, rows: list[dict[str, object]],
             save: Callable[[], None], match: str = "") -> None:
    """Every MoE candidate at every token count, uniform and skewed routing: gate_up (+ SwiGLU, incl.
    quantising x) and down (x routing weight, incl. quantising h unless gate_up did) against the
    ceiling, on the useful (unpadded) FLOPs; the align; each candidate's output against the first's.
    Each stage's roofline is the longer of its FLOPs at the ceiling and its used experts' weights
    read once at the copy rate: below ~170-200 rows an expert (H200-H100; ~6K tokens at top-8 of 256)
    the weights' bytes bound it."""
    w = fp8_experts()
    for t in tokens:
        x = torch.randn(t, H, device=DEV, dtype=torch.bfloat16)
        pairs = t * TOP_K
        flops = {"gate_up": 2 * pairs * H * 2 * I, "down": 2 * pairs * I * H}
        for routing in ("uniform", "skewed"):
            ids, weights = moe_routing(t, routing == "skewed")
            used = int(torch.unique(ids).numel())
            floor_us = {stage: max(flops[stage] / ceiling / 1e6, expert_weight_bytes(w, stage, used) / copy / 1e6)
                        for stage in flops}
            base = {"T": t, "routing": routing, "bucket": rows_bucket(pairs, E)}
            groupings = {}
            first_out = None
            for name, (bm, gu_cfg, dn_cfg) in MOE_CANDIDATES.items():
                if not re.search(match, name):
                    continue
                bm = bm or moe_regime(pairs, E).block_m
                if bm not in groupings:
                    groupings[bm] = align_experts(ids, E, bm)
                    # do_bench's time holds its three launches from Python; the graph's is the
                    # device's, what it adds to a step the GPU bounds
                    align = partial(align_experts, ids, E, bm)
                    rows.append({**base, "candidate": f"align, {bm} rows per block", "block_m": bm,
                                 "us": median_us(align), "graph us": graph_us([align])})
                g = groupings[bm]
                row: dict[str, object] = {**base, "candidate": name, "block_m": bm}
                try:
                    hidden = moe_gate_up(x, w["gate_up"], w["gate_up_scale"], g, **gu_cfg)
                    y = moe_down(hidden, w["down"], w["down_scale"], weights, g, **dn_cfg)
                    out = moe_combine(y, ids, E, x.dtype).float()
                    first_out = out if first_out is None else first_out
                    row["rel err vs first"] = ((out - first_out).abs().max() / first_out.abs().max()).item()
                    us = {"gate_up": median_us(lambda: moe_gate_up(x, w["gate_up"], w["gate_up_scale"], g, **gu_cfg),
                                               warmup_ms=5, rep_ms=25),
                          "down": median_us(lambda: moe_down(hidden, w["down"], w["down_scale"], weights, g, **dn_cfg),
                                            warmup_ms=5, rep_ms=25)}
                except Exception as err:  # noqa: BLE001 - a candidate that fails to compile or run is reported
                    print(f"  MoE T={t} {routing} {name}: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
                    rows.append({**row, "us": f"fails: {type(err).__name__}"})
                    continue
                for stage in ("gate_up", "down"):
                    row[f"{stage} us"] = us[stage]
                    row[f"{stage} vs ceiling"] = tflops(flops[stage], us[stage]) / ceiling
                    row[f"{stage} vs roofline"] = floor_us[stage] / us[stage]
                row["us"] = us["gate_up"] + us["down"]
                row["TFLOP/s"] = tflops(flops["gate_up"] + flops["down"], row["us"])
                row["vs ceiling"] = row["TFLOP/s"] / ceiling
                row["vs roofline"] = (floor_us["gate_up"] + floor_us["down"]) / row["us"]
                rows.append(row)
            for backend, experts in experts_backends():
                us = median_us(lambda experts=experts: experts.forward(
                    x, w["gate_up"], w["down"], ids, weights, w["gate_up_scale"], w["down_scale"]), warmup_ms=5, rep_ms=25)
                rows.append({**base, "candidate": f"{WHOLE_CALL} on the {backend} backend", "us": us,
                             "vs ceiling": tflops(flops["gate_up"] + flops["down"], us) / ceiling,
                             "vs roofline": (floor_us["gate_up"] + floor_us["down"]) / us})
            h_bf16 = torch.randn(pairs, I, device=DEV, dtype=torch.bfloat16)
            rows.append({**base, "candidate": "quantise h alone (in down's time unless q)",
                         "us": median_us(lambda: quantize_activations(h_bf16))})
            if first_out is not None:
                rows.append({**base, "candidate": "combine", "us": median_us(lambda: moe_combine(y, ids, E, x.dtype))})
            print(table([r for r in rows if r["T"] == t and r["routing"] == routing],
                        f"MoE T={t}, {routing} routing, {used} experts used (ceiling {ceiling:.0f} TFLOP/s, "
                        f"copy {copy:.2f} TB/s; roofline gate_up {floor_us['gate_up']:.0f} us, down {floor_us['down']:.0f} us)"))
            save()


WHOLE_CALL = "the whole routed experts' call (align, x's codes, GEMMs, combine)"


def experts_backends() -> list[tuple[str, object]]:
    """The MoE backends to time whole: triton, and deep_gemm where it runs."""
    from minisgl.kernels.moe_deep_gemm import unavailable_reason
    from minisgl.moe.registry import MOE_BACKENDS

    names = ["triton"] + (["deep_gemm"] if unavailable_reason(torch.device(DEV)) is None else [])
    return [(name, MOE_BACKENDS.get(name)()) for name in names]


def moe_summary(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per token count and routing: the regime's figures and the fastest candidate (REGIMES' choice)."""
    out = []
    for key in dict.fromkeys((r["T"], r["routing"], r["bucket"]) for r in rows):
        here = [r for r in rows if (r["T"], r["routing"], r["bucket"]) == key]
        whole = [r for r in here if r["candidate"].startswith(WHOLE_CALL)]
        timed = [r for r in here if "vs ceiling" in r and r not in whole]
        fastest = [max(timed, key=lambda r: r["vs ceiling"])] if timed else []
        for r in [r for r in here if r["candidate"].startswith("align")] + timed[:1] + [
                r for r in fastest if r is not timed[0]]:
            fig = f"{r['us']:.1f} us" if isinstance(r["us"], float) else r["us"]
            if "graph us" in r:
                fig += f" ({r['graph us']:.1f} us in a graph)"
            ratio = "-"
            if "vs ceiling" in r:
                ratio = (f"{r['vs ceiling']:.2f} (gate_up {r['gate_up vs ceiling']:.2f}, "
                         f"down {r['down vs ceiling']:.2f}) of ceiling; {r['vs roofline']:.2f} of roofline")
            out.append({"what": f"MoE T={key[0]} {key[1]} (bucket {key[2]}): {r['candidate']}"
                                + (" [fastest]" if r is not timed[0] and "vs ceiling" in r else ""),
                        "figure": fig, "ratio": ratio})
        out += [{"what": f"MoE T={key[0]} {key[1]}: {r['candidate']}", "figure": f"{r['us']:.1f} us",
                 "ratio": f"{r['vs ceiling']:.2f} of ceiling; {r['vs roofline']:.2f} of roofline"} for r in whole]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--moe-tokens", default="1024,4096,16384")
    ap.add_argument("--moe-match", default="", help="a regular expression: only the MoE candidates it finds in their names")
    ap.add_argument("--model", default=MODEL, help="a known config (models/known_configs.py) for the engine steps")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the config's (default: all)")
    ap.add_argument("--steps", default="16x1024,2x8192",
                    help="prefill steps BxN (B prompts of N tokens), or BxN@P after P cached tokens")
    ap.add_argument("--decode-batches", default="32,64", help="decode check at 1K context; '' for none")
    ap.add_argument("--mixed", default="1024+56,2048+56",
                    help="CHUNK+D: a CHUNK-token prefill beside D decode rows, eager as served; '' for none")
    ap.add_argument("--piecewise-max-tokens", type=int, default=None,
                    help="the engine's --piecewise-cuda-graph-max-tokens: steps up to it are also timed replayed "
                         "from the graphs (default: the engine's own when decode or mixed rows are asked for, which "
                         "turn CUDA graphs on, else none; 0: eager steps only)")
    ap.add_argument("--gdn-group-tokens", default="",
                    help="comma-separated bounds (>= 1) on the tokens of a GDN chunked-rule group (prefill_groups.py) "
                         "to time each step with (default: the engine's own). Larger groups take more activation "
                         "memory than the engine's planner reserves for")
    ap.add_argument("--lone-prompts-whole", action="store_true",
                    help="also time each step with lone prompts run whole, not as halves (prefill_groups.prefill_calls)")
    ap.add_argument("--moe-backend", default="auto", help="the engine steps' --moe-backend")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--moe-only", action="store_true", help="the ceiling and the MoE candidates only")
    args = ap.parse_args()
    if any(int(v) < 1 for v in args.gdn_group_tokens.split(",") if v):
        ap.error(f"--gdn-group-tokens must be >= 1, got {args.gdn_group_tokens}")
    torch.manual_seed(0)
    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "regimes": [str(r) for r in REGIMES],
                              "cublas block scaling": cublas_block_scaling(torch.device(DEV)) or "supported"}

    def save() -> None:
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "bench_prefill.json"), "w") as f:
                json.dump(out, f, indent=1, default=str)

    out["ceilings"] = ceil = ceilings()
    ceiling = ceil["fp8 rowwise _scaled_mm 8192^3 TFLOP/s"]
    print(f"{out['device']}, torch {out['torch']}; {ceil}; cuBLAS block scaling: {out['cublas block scaling']}")
    save()
    summary: list[dict[str, object]] = []
    if not args.skip_kernels and not args.moe_only:
        out["quantiser"] = quantiser_rows([4096, 16384], ceil["copy TB/s"])
        print(table(out["quantiser"], "Activation quantiser"))
        save()
        out["linear"], out["linear winners"] = linear_rows([int(t) for t in args.tokens.split(",")], ceiling)
        print(table(out["linear"], f"FP8 projections, GEMM alone (ceiling {ceiling:.0f} TFLOP/s)"))
        save()
    if not args.skip_kernels or args.moe_only:
        try:
            out["moe"] = []
            moe_rows([int(t) for t in args.moe_tokens.split(",")], ceiling, ceil["copy TB/s"], out["moe"], save,
                     args.moe_match)
        except Exception:  # noqa: BLE001 - keep the model step's figures even if the MoE bench breaks
            traceback.print_exc()
        save()
    if not args.skip_model and not args.moe_only:
        steps = [PrefillStep.parse(s) for s in args.steps.split(",")]
        decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
        mixed = [tuple(int(v) for v in m.split("+")) for m in args.mixed.split(",") if m]
        out["model"], out["decode"], out["profile"] = model_rows(args.model, args.layers, steps, decode_batches, ceiling,
                                                                 ceil["copy TB/s"], mixed, args.piecewise_max_tokens,
                                                                 [int(v) for v in args.gdn_group_tokens.split(",") if v],
                                                                 (True, False) if args.lone_prompts_whole else (True,),
                                                                 args.moe_backend)
        print(out["profile"])
        save()
    print(table([out["ceilings"]], "Ceilings (this run)"))
    for r in out.get("quantiser", []):
        summary.append({"what": f"quantiser {r['M']}x{r['K']}", "figure": f"{r['quantise us']:.1f} us",
                        "ratio": f"{r['vs copy']:.2f} of copy"})
    for r in out.get("linear winners", []):
        summary.append({"what": f"projections M={r['M']}: fastest {r['fastest over all shapes']} "
                                f"(regime now: {r['regime now']})",
                        "figure": f"{r['its TFLOP/s']:.0f} TFLOP/s (regime {r['regime TFLOP/s']:.0f})",
                        "ratio": f"{r['vs ceiling']:.2f} of ceiling"})
    summary += moe_summary(out.get("moe", []))
    for r in out.get("model", []):
        if "decode-only graph ms" in r:
            summary.append({"what": f"mixed step {r['step']}",
                            "figure": f"{r['step ms']:.1f} ms (host {r['host ms']:.1f} ms)",
                            "ratio": f"{r['decode-only graph ms']:.1f} ms decode graph alone"})
            continue
        summary.append({"what": f"prefill step {r['step']} ({r['layers']} layers)",
                        "figure": f"{r['tokens/s']:.0f} tok/s ({r['step ms']:.1f} ms, host {r['host ms']:.1f} ms); "
                                  f"back to back {r['back-to-back tok/s']:.0f} tok/s ({r['back-to-back ms']:.1f} ms)",
                        "ratio": f"{r['vs roofline']:.2f} of FLOP roofline "
                                 f"({r['roofline ms'] / r['back-to-back ms']:.2f} back to back)"})
    for r in out.get("decode", []):
        summary.append({"what": f"decode B={r['B']} at {r['context']} ({r['layers']} layers, graphs)",
                        "figure": f"{r['step ms']:.2f} ms, {r['tokens/s']:.0f} tok/s",
                        "ratio": f"{r['vs roofline']:.2f} of byte roofline"})
    print(table(summary, f"Summary (FP8 ceiling {ceiling:.0f} TFLOP/s, copy {ceil['copy TB/s']:.2f} TB/s)"))


if __name__ == "__main__":
    main()
