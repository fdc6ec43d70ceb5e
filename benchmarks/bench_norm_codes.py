"""The RMS norms that write their readers' FP8 codes (kernels/rms_norm.py, quantise=True) at a prefill
step's size, each against the same norm without codes and the quantiser's own pass, for a few
(rows a program, warps) tiles; every figure also as a share of the copy rate measured in the run.

    python benchmarks/bench_norm_codes.py [--tokens 16384] [--hidden 3072] [--heads 64 --head-dim 128]

Shapes: the input norm [T, hidden], the post-mixer add + norm, and GDN's output norm [T, heads,
head_dim] (gated). Before timing, each tile's codes are checked bit for bit against
quantize_activations of the y it returns. Times are do_bench medians, in microseconds.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from triton.testing import do_bench

from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.fp8_quant import quantize_activations
from minisgl.kernels.rms_norm import add_rms_norm, gated_rms_norm, rms_norm

EPS = 1e-6
# (rows a program, warps); None: the launcher's choice.
TILES = {"wide": [None, (1, 4), (2, 8), (4, 8)], "gated": [None, (8, 4), (16, 4), (16, 8), (32, 8)]}


def copy_rate() -> float:
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(2**28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / (do_bench(lambda: b.copy_(a)) * 1e-3)


def check_codes(norm: Callable[..., object]) -> None:
    """norm() returns Activations (or (h, Activations)): its codes must be the quantiser's of its y."""
    out = norm()
    acts = out[1] if isinstance(out, tuple) else out
    q, s = acts.fp8()
    ref_q, ref_s = quantize_activations(acts.x, ROWS_MULTIPLE)
    t = acts.x.shape[0]
    if not (torch.equal(q[:t].view(torch.uint8), ref_q[:t].view(torch.uint8)) and torch.equal(s[:t], ref_s[:t])):
        raise SystemExit("codes or scales differ from quantize_activations of the norm's y")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--heads", type=int, default=64, help="GDN value heads (the output norm's rows a token)")
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    t, bf16 = args.tokens, torch.bfloat16
    copy = copy_rate()
    print(f"copy {copy / 1e12:.2f} TB/s; {t} tokens; bf16")
    x = torch.randn(t, args.hidden, device="cuda", dtype=bf16)
    delta = torch.randn_like(x)
    w = (torch.randn(args.hidden, device="cuda") * 0.2).to(bf16)
    o = torch.randn(t, args.heads, args.head_dim, device="cuda", dtype=bf16)
    z = torch.randn_like(o)
    wg = (torch.randn(args.head_dim, device="cuda") * 0.2 + 1).to(bf16)
    n, ng = x.numel(), o.numel()
    rows: list[tuple[str, Callable[[], object], int]] = [
        ("quantiser alone [T, hidden]", lambda: quantize_activations(x, ROWS_MULTIPLE), 3 * n),
        ("quantiser alone [T, heads x head_dim]", lambda: quantize_activations(o.view(t, -1), ROWS_MULTIPLE), 3 * ng),
        ("add + norm", lambda: add_rms_norm(x, delta, w, EPS, True), 8 * n),
        ("add + norm + codes", lambda: add_rms_norm(x, delta, w, EPS, True, quantise=True), 9 * n),
    ]
    for tile in TILES["wide"]:
        rows.append((f"input norm, tile {tile}", lambda tile=tile: rms_norm(x, w, EPS, True, tile=tile), 4 * n))
        rows.append((f"input norm + codes, tile {tile}",
                     lambda tile=tile: rms_norm(x, w, EPS, True, quantise=True, tile=tile), 5 * n))
    for tile in TILES["gated"]:
        rows.append((f"GDN output norm, tile {tile}", lambda tile=tile: gated_rms_norm(o, z, wg, EPS, tile=tile), 6 * ng))
        rows.append((f"GDN output norm + codes, tile {tile}",
                     lambda tile=tile: gated_rms_norm(o, z, wg, EPS, quantise=True, tile=tile), 7 * ng))
    print("| kernel | us | of copy |\n|---|---|---|")
    for name, fn, nbytes in rows:
        if "codes" in name:
            check_codes(fn)
        us = do_bench(fn) * 1e3
        print(f"| {name} | {us:.1f} | {nbytes / (us * 1e-6) / copy:.2f} |")


if __name__ == "__main__":
    main()
