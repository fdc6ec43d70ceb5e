"""Fused MoE and FP8 linear kernels at Qwen3.5-122B shapes against the copy bandwidth, in one process.

    python benchmarks/bench_moe.py [--sweep] [--batches 16,64,256]

In one run: a device-to-device copy (the ceiling, read + write counted); the fused MoE
(TritonExperts, FP8 and BF16) for B tokens routed top-8 over 256 experts (H=3072, I=1024), whole
and stage by stage, against the bytes of the experts actually touched; a naive per-expert torch
loop (TorchExperts, BF16) as the reference; and the FP8 linear at the 122B projection shapes
against torch._scaled_mm with 1x128 / 128x128 block scales (activation quantisation in torch
included) and BF16 cuBLAS. --sweep first times the kernels' tilings. Each time is the median of
triton's do_bench. Prints markdown tables; writes bench_moe.json under $OUT when set.
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from gpu_timing import copy_tbps, graph_us, median_us, table
from minisgl.kernels.fp8_linear import fp8_linear
from minisgl.kernels.moe_align import align_experts
from minisgl.kernels.moe_gemm import moe_combine, moe_down, moe_gate_up
from minisgl.layers.fp8 import FP8_DTYPE, cdiv, dequantize_block_fp8, quantize_block_fp8
from minisgl.moe.torch_experts import TorchExperts
from minisgl.moe.triton_experts import TritonExperts

DEV = "cuda"
H, I, E, K = 3072, 1024, 256, 8
# (name, N, K) of the 122B FP8 projections a decode step runs.
LINEARS = [
    ("gdn in_proj_qkv", 12288, 3072), ("gdn in_proj_z", 8192, 3072), ("attn q_proj", 16384, 3072),
    ("out_proj / o_proj", 3072, 8192), ("shared gate/up", 1024, 3072), ("shared down", 3072, 1024),
]
TILINGS = [(32, 4, 4), (64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 8, 4), (128, 8, 3), (128, 8, 4)]


def fp8_experts() -> dict[str, torch.Tensor]:
    """Random FP8 expert weights with random block scales, plus their bf16 dequantisation."""
    w = {"gate_up": torch.empty(E, 2 * I, H, dtype=FP8_DTYPE, device=DEV),
         "down": torch.empty(E, H, I, dtype=FP8_DTYPE, device=DEV)}
    for e in range(E):
        w["gate_up"][e] = torch.randn(2 * I, H, device=DEV, dtype=torch.bfloat16)
        w["down"][e] = torch.randn(H, I, device=DEV, dtype=torch.bfloat16)
    w["gate_up_scale"] = torch.rand(E, 2 * cdiv(I, 128), cdiv(H, 128), device=DEV).add(0.5) / H**0.5
    w["down_scale"] = torch.rand(E, cdiv(H, 128), cdiv(I, 128), device=DEV).add(0.5) / I**0.5
    return w


def bf16_experts(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    gate_up = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=DEV)
    down = torch.empty(E, H, I, dtype=torch.bfloat16, device=DEV)
    nb = cdiv(I, 128)
    for e in range(E):
        s = w["gate_up_scale"][e]
        gate_up[e, :I] = dequantize_block_fp8(w["gate_up"][e, :I], s[:nb], dtype=torch.bfloat16)
        gate_up[e, I:] = dequantize_block_fp8(w["gate_up"][e, I:], s[nb:], dtype=torch.bfloat16)
        down[e] = dequantize_block_fp8(w["down"][e], w["down_scale"][e], dtype=torch.bfloat16)
    return {"gate_up": gate_up, "down": down}


def routing(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(b, E, device=DEV).topk(K, dim=-1).indices
    return ids, torch.rand(b, K, device=DEV).softmax(-1).to(torch.bfloat16)


def expert_bytes(ids: torch.Tensor, per_expert: int) -> tuple[int, int]:
    touched = int(ids.unique().numel())
    return touched, touched * per_expert


def moe_rows(batches: list[int], w8: dict, w16: dict, copy: float) -> list[dict[str, object]]:
    fp8_per_expert = 3 * H * I + (w8["gate_up_scale"][0].numel() + w8["down_scale"][0].numel()) * 4
    experts = TritonExperts()
    rows = []
    for b in batches:
        x = torch.randn(b, H, dtype=torch.bfloat16, device=DEV)
        ids, weights = routing(b)
        touched, nbytes = expert_bytes(ids, fp8_per_expert)
        g = align_experts(ids, E)
        h = moe_gate_up(x, w8["gate_up"], w8["gate_up_scale"], g)
        y = moe_down(h, w8["down"], w8["down_scale"], weights, g)
        stages = {
            "align": median_us(lambda: align_experts(ids, E)),
            "gate_up": median_us(lambda: moe_gate_up(x, w8["gate_up"], w8["gate_up_scale"], g)),
            "down": median_us(lambda: moe_down(h, w8["down"], w8["down_scale"], weights, g)),
            "combine": median_us(lambda: moe_combine(y, ids, E, x.dtype)),
        }
        fp8_us = median_us(lambda: experts.forward(x, w8["gate_up"], w8["down"], ids, weights,
                                                   w8["gate_up_scale"], w8["down_scale"]))
        bf16_us = median_us(lambda: experts.forward(x, w16["gate_up"], w16["down"], ids, weights))
        torch_us = median_us(lambda: TorchExperts().forward(x, w16["gate_up"], w16["down"], ids, weights),
                             warmup_ms=5, rep_ms=50)
        tbps = nbytes / fp8_us / 1e6
        rows.append({
            "B": b, "experts touched": touched, "expert MB (fp8)": nbytes / 1e6,
            "fp8 fused us": fp8_us, "TB/s": tbps, "vs copy": tbps / copy,
            **{f"{k} us": v for k, v in stages.items()},
            "bf16 fused us": bf16_us, "bf16 vs copy": 2 * nbytes / bf16_us / 1e6 / copy,
            "torch loop us (bf16)": torch_us, "fp8 speedup vs torch loop": torch_us / fp8_us,
        })
    return rows


def moe_sweep(batches: list[int], w8: dict, copy: float) -> list[dict[str, object]]:
    rows = []
    for b in batches:
        x = torch.randn(b, H, dtype=torch.bfloat16, device=DEV)
        ids, weights = routing(b)
        for block_m in sorted({16, 32} if b >= 256 else {16}):
            g = align_experts(ids, E, block_m)
            touched = int(ids.unique().numel())
            h = moe_gate_up(x, w8["gate_up"], w8["gate_up_scale"], g)
            for bn, warps, stages in TILINGS:
                cfg = dict(block_n=bn, num_warps=warps, num_stages=stages)
                for name, fn, nbytes in (
                    ("gate_up", lambda: moe_gate_up(x, w8["gate_up"], w8["gate_up_scale"], g, **cfg), 2 * H * I),
                    ("down", lambda: moe_down(h, w8["down"], w8["down_scale"], weights, g, **cfg), H * I),
                ):
                    try:
                        us = median_us(fn, warmup_ms=10, rep_ms=40)
                    except Exception as err:  # noqa: BLE001 - a tiling that fails to compile is reported, not fatal
                        print(f"  {name} B={b} BM={block_m} {cfg}: {type(err).__name__}: {str(err)[:120]}")
                        continue
                    tbps = touched * nbytes / us / 1e6
                    rows.append({"stage": name, "B": b, "BLOCK_M": block_m, "BLOCK_N": bn, "warps": warps,
                                 "stages": stages, "us": us, "vs copy": tbps / copy})
    return rows


def scaled_mm_block(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales (cuBLAS, sm90, CUDA >= 12.9):
    activation scales outer-dim-major, weight scales [ceil(K/128) padded to 4, N/128] K-major."""
    xq, xs = quantize_block_fp8(x, (1, 128))
    kb = s.shape[1]
    ws = F.pad(s, (0, -kb % 4)).t()
    return torch._scaled_mm(xq, w.t(), scale_a=xs.t().contiguous().t(), scale_b=ws, out_dtype=torch.bfloat16)


L2_ROTATION_BYTES = 256 << 20  # weight copies per graph: together 5x the H200's 50 MB L2


def linear_rows(tokens: list[int], copy: float, sweep: bool) -> list[dict[str, object]]:
    """The FP8 linear and BF16 cuBLAS timed in CUDA graphs over enough weight copies that every call
    reads its weight from HBM (gpu_timing.graph_us); _scaled_mm eagerly (it is far slower anyway)."""
    rows = []
    for name, n, k in LINEARS:
        w, s = quantize_block_fp8(torch.randn(n, k, device=DEV) / k**0.5)
        w16 = dequantize_block_fp8(w, s, dtype=torch.bfloat16)
        nbytes = w.numel() + s.numel() * 4
        copies = [(w.clone(), s.clone(), w16.clone()) for _ in range(-(-L2_ROTATION_BYTES // nbytes))]
        for m in tokens:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=DEV)

            def ours(**cfg: int) -> float:
                return graph_us([lambda w=w, s=s: fp8_linear(x, w, s, backend="split_k", **cfg) for w, s, _ in copies])

            us = ours()
            row = {"linear": name, "N": n, "K": k, "M": m, "fp8 triton us": us, "vs copy": nbytes / us / 1e6 / copy}
            if sweep:
                best = min((ours(block_n=bn, split_k=sk, num_stages=st), bn, sk, st)
                           for bn in (32, 64, 128) for sk in (1, 2, 4, 8) for st in (3, 5))
                row["best us (BLOCK_N, split, stages)"] = f"{best[0]:.1f} {best[1:]}"
            try:
                ref = x.float() @ w16.float().t()
                err = ((scaled_mm_block(x, w, s).float() - ref).abs().max() / ref.abs().max()).item()
                row["_scaled_mm us (quant+mm)"] = median_us(lambda: scaled_mm_block(x, w, s))
                row["_scaled_mm rel err"] = err
            except Exception as e:  # noqa: BLE001 - report why this torch cannot do block scaling
                row["_scaled_mm us (quant+mm)"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
                row["_scaled_mm rel err"] = "-"
            bf16 = graph_us([lambda w16=w16: F.linear(x, w16) for _, _, w16 in copies])
            row["bf16 cuBLAS us"] = bf16
            row["bf16 vs copy"] = 2 * n * k / bf16 / 1e6 / copy
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--batches", default="16,64,256")
    ap.add_argument("--tokens", default="1,16,64,256")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.manual_seed(0)
    copy = copy_tbps()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy bandwidth {copy:.2f} TB/s")
    w8 = fp8_experts()
    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "copy_tbps": copy}
    if args.sweep:
        out["moe_sweep"] = moe_sweep(batches, w8, copy)
        print(table(out["moe_sweep"], "MoE tilings (FP8)"))
    w16 = bf16_experts(w8)
    out["moe"] = moe_rows(batches, w8, w16, copy)
    del w16
    out["linear"] = linear_rows([int(t) for t in args.tokens.split(",")], copy, args.sweep)
    print(table(out["linear"], "FP8 linear (122B projections)"))
    print(table(out["moe"], f"Fused MoE, H={H} I={I} E={E} top-{K} (copy {copy:.2f} TB/s)"))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_moe.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
