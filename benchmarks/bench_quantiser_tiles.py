"""The activation quantiser (kernels/fp8_quant.py) at decode and prefill sizes, for each tile height
and warp count, in CUDA graphs as decode replays it.

    python benchmarks/bench_quantiser_tiles.py [--tokens 64,200,256,16384] [--widths 2048,3072]

Every variant's codes and scales are first checked bit for bit against quantize_activations (the
tiles in use), then timed with gpu_timing.graph_us over a few inputs; prints, per shape, the time
in use and the five fastest variants, in microseconds.
"""
from __future__ import annotations

import argparse

import torch
import triton

from gpu_timing import graph_us
from minisgl.kernels.fp8_format import FP8_DTYPE, FP8_MAX
from minisgl.kernels.fp8_quant import GROUP, _quantize_groups_kernel, quantize_activations


def quantise(x: torch.Tensor, rows: int, warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(k // GROUP, m, dtype=torch.float32, device=x.device)
    _quantize_groups_kernel[(triton.cdiv(m, rows), k // GROUP)](
        x, q, s, m, k, x.stride(0), q.stride(0), s.stride(0), ROWS=rows, BLOCK=GROUP, FP8_MAX=FP8_MAX, num_warps=warps)
    return q, s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,200,256,16384")
    ap.add_argument("--widths", default="2048,3072", help="K, multiples of 128")
    args = ap.parse_args()
    for m in (int(t) for t in args.tokens.split(",")):
        for k in (int(w) for w in args.widths.split(",")):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(8 if m < 1000 else 2)]
            ref_q, ref_s = quantize_activations(xs[0])
            times = {"in use": graph_us([lambda x=x: quantize_activations(x) for x in xs])}
            for rows in (1, 2, 4, 8, 16, 32, 64):
                for warps in (1, 2, 4, 8):
                    if rows * GROUP < 32 * warps:
                        continue
                    q, s = quantise(xs[0], rows, warps)
                    if not (torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s.t(), ref_s)):
                        raise SystemExit(f"rows {rows}, {warps} warps: codes or scales differ from "
                                         "quantize_activations")
                    times[f"r{rows} w{warps}"] = graph_us([lambda x=x, r=rows, w=warps: quantise(x, r, w) for x in xs])
            best = sorted(times.items(), key=lambda kv: kv[1])[:5]
            fastest = [(n, round(v, 2)) for n, v in best]
            print(f"M={m} K={k}: in use {times['in use']:.2f} us; fastest {fastest}", flush=True)


if __name__ == "__main__":
    main()
