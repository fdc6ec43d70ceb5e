"""Full attention's elementwise glue, before and after fusion, against the device's copy bandwidth.

    python benchmarks/bench_attention_glue.py [--tokens 16384,64]

Per attention layer of Qwen3.5-122B (32 q heads read from the gated [T, 32, 2·256] q_proj output,
2 KV heads, rotary_dim 64), bf16: the torch path of main (rms_norm kernel, RotaryEmbedding.apply's
neg/cat/mul/add, the gate's reshape copy, sigmoid then multiply) against the fused kernels
(qk_norm_rope for q and k, sigmoid_gate), and the gate with o_proj's FP8 codes: the quantiser's
pass after the gate against the gate writing them (`codes`). `ideal` is the fused kernels' minimum
traffic (q, k and the gate's three tensors read or written once, plus the codes and scales) at the
measured copy bandwidth; `vs_ideal` is time / ideal. Prints a table; writes attention_glue.json
under $OUT when set.
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch

from gpu_timing import copy_tbps, median_us, table
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import quantize_activations
from minisgl.kernels.qk_norm_rope import norm_rope
from minisgl.kernels.rms_norm import rms_norm
from minisgl.kernels.sigmoid_gate import sigmoid_gate
from minisgl.layers.rotary import RotaryEmbedding

HQ, HKV, D, ROTARY_DIM, EPS = 32, 2, 256, 64, 1e-6
DTYPE = torch.bfloat16


def glue_paths(t: int) -> dict[str, Callable[[], object]]:
    """The old and new q, k and gate glue of one layer at T tokens, on fresh random operands."""
    proj = torch.randn(t, HQ, 2 * D, device="cuda", dtype=DTYPE)
    q, gate = proj.split(D, dim=-1)
    k = torch.randn(t, HKV, D, device="cuda", dtype=DTYPE)
    o = torch.randn(t, HQ, D, device="cuda", dtype=DTYPE)
    wq, wk = (torch.randn(D, device="cuda").mul(0.2).to(DTYPE) for _ in range(2))
    rotary = RotaryEmbedding(ROTARY_DIM, 1e7)
    cos, sin = rotary.cos_sin(torch.randint(0, 1 << 18, (t,), device="cuda"), DTYPE)

    def old_qk() -> object:
        return (rotary.apply(rms_norm(q, wq, EPS, True), cos, sin), rotary.apply(rms_norm(k, wk, EPS, True), cos, sin))

    def new_qk() -> object:
        return (norm_rope(q, wq, cos, sin, EPS, True, ROTARY_DIM), norm_rope(k, wk, cos, sin, EPS, True, ROTARY_DIM))

    def old_gate() -> object:
        return o.reshape(t, HQ * D) * torch.sigmoid(gate.reshape(t, HQ * D))

    def new_gate() -> object:
        return sigmoid_gate(o, gate)

    def old_codes() -> object:
        return quantize_activations(sigmoid_gate(o, gate).view(t, HQ * D), ROWS_MULTIPLE)

    def new_codes() -> object:
        return sigmoid_gate(o, gate, quantise=True)

    return {"qk old": old_qk, "qk new": new_qk, "gate old": old_gate, "gate new": new_gate,
            "codes old": old_codes, "codes new": new_codes,
            "all old": lambda: (old_qk(), old_gate()), "all new": lambda: (new_qk(), new_gate())}


def min_bytes(t: int, part: str) -> int:
    """Traffic of the fused kernels: q and k read and written once, o and gate read, out written."""
    size = torch.finfo(DTYPE).bits // 8
    qk = 2 * t * (HQ + HKV) * D * size + 2 * t * ROTARY_DIM * size
    gate = 3 * t * HQ * D * size
    codes = gate + t * HQ * D + 4 * t * HQ * D // 128  # FP8 codes and fp32 group scales written too
    return {"qk": qk, "gate": gate, "codes": codes, "all": qk + gate}[part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="16384,64", help="comma-separated token counts")
    args = parser.parse_args()
    tbps = copy_tbps()
    rows = []
    for t in (int(n) for n in args.tokens.split(",")):
        paths = glue_paths(t)
        times = {name: median_us(fn) for name, fn in paths.items()}
        for name, us in times.items():
            part, which = name.split()
            ideal = min_bytes(t, part) / (tbps * 1e6)
            row = {"tokens": t, "glue": part, "path": which, "us": us, "ideal_us": ideal, "vs_ideal": us / ideal}
            if which == "new":
                row["speedup"] = times[f"{part} old"] / us
            rows.append(row)
    print(f"copy bandwidth {tbps:.2f} TB/s")
    print(table(rows, "attention glue per layer (122B, bf16)"))
    if out := os.environ.get("OUT"):
        with open(os.path.join(out, "attention_glue.json"), "w") as f:
            json.dump({"copy_tbps": tbps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
