"""The paged extend (prefill) attention kernel against a contiguous flash attention, in one run.

    python benchmarks/bench_extend_attention.py [--steps 16x1024@16384,16x1024,2x8192@8192] [--quick]

For Qwen3.5-35B-A3B's and 122B's full-attention shapes (16 or 32 query heads over 2 KV heads, head
dim 256, bf16, pages of 64 tokens) and each prefill step (BxN@P: B requests of N new tokens after
P cached ones, as prefill_steps.py writes them), it times kernels/paged_attention.paged_extend with
every tiling in TILINGS and the default (whole-page K/V tiles through TMA where the kernel takes
them, and the default once more on pointer loads), after checking each against a float32 reference
on a small ragged batch, and times torch's scaled_dot_product_attention (flash and cuDNN backends) on the
same work laid out contiguously (KV heads repeated to the query heads, causal aligned to the end):
the anchor every ratio below is of, measured in the same run. TFLOP/s count QK^T and PV only
(prefill_steps.attention_flops). Prints tables; writes bench_extend_attention.json under $OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from gpu_timing import median_us, table
from prefill_steps import PrefillStep, attention_flops
from minisgl.kernels.paged_attention import extend_tiling, paged_extend

PAGE = 64
DIM = 256
MODELS = {"Qwen3.5-35B-A3B": (16, 2), "Qwen3.5-122B-A10B": (32, 2)}  # (query heads, KV heads)
# (block_m, block_n, num_warps, num_stages): query rows (tokens x heads of a group) and keys per
# tile; shared memory holds num_stages K and V tiles of block_n x 256 bf16 (32 KB each at 64).
Tiling = tuple[int, int, int, int] | None  # None: extend_tiling's
TILINGS = [
    (128, 64, 8, 2), (128, 64, 8, 1), (128, 32, 8, 3), (128, 32, 8, 2), (128, 128, 8, 1), (64, 64, 4, 2),
    (64, 32, 4, 3), (64, 64, 8, 2),
]


def paged_setup(step: PrefillStep, heads: int, kv_heads: int, dtype: torch.dtype = torch.bfloat16):
    """Random q and caches, each request's pages shuffled over the cache: (q, k_cache, v_cache,
    table, rows, seq_lens, cu_seqlens)."""
    total = step.prefix + step.tokens
    width = -(-total // PAGE)
    pages = torch.randperm(step.requests * width, device="cuda").int().view(step.requests, width)
    k = torch.randn(step.requests * width * PAGE, kv_heads, DIM, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(step.requests * step.tokens, heads, DIM, dtype=dtype, device="cuda")
    rows = torch.arange(step.requests, dtype=torch.int32, device="cuda")
    lens = torch.full((step.requests,), total, dtype=torch.int32, device="cuda")
    cu = torch.arange(step.requests + 1, dtype=torch.int32, device="cuda") * step.tokens
    return q, k, v, pages, rows, lens, cu


def gathered(cache: torch.Tensor, pages: torch.Tensor, row: int, length: int) -> torch.Tensor:
    """One request's first `length` positions of a paged cache: [length, Hkv, D]."""
    pos = torch.arange(length, device=cache.device)
    return cache[pages[row, pos // PAGE].long() * PAGE + pos % PAGE]


def reference(q, k, v, pages, prefix: list[int], extend: list[int]) -> torch.Tensor:  # noqa: ANN001
    """float32 causal attention of each request's new tokens over its gathered keys."""
    outs, start = [], 0
    for i, (p, n) in enumerate(zip(prefix, extend)):
        kk, vv = (gathered(c, pages, i, p + n).float() for c in (k, v))
        group = q.shape[1] // kk.shape[1]
        kk, vv = (t.repeat_interleave(group, dim=1).transpose(0, 1) for t in (kk, vv))
        qq = q[start : start + n].float().transpose(0, 1)
        scores = qq @ kk.transpose(1, 2) * DIM**-0.5
        visible = torch.arange(p + n, device=q.device)[None, :] <= (p + torch.arange(n, device=q.device))[:, None]
        outs.append((scores.masked_fill(~visible, float("-inf")).softmax(-1) @ vv).transpose(0, 1))
        start += n
    return torch.cat(outs)


def check(tiling: Tiling, tma: bool | None, heads: int, kv_heads: int) -> float:
    """Largest error relative to the reference's largest value, on a ragged batch over page edges."""
    prefix, extend = [0, 17, 64, 250, 1000], [70, 5, 64, 130, 300]
    width = -(-max(p + n for p, n in zip(prefix, extend)) // PAGE)
    pages = torch.randperm(len(prefix) * width, device="cuda").int().view(len(prefix), width)
    k = torch.randn(len(prefix) * width * PAGE, kv_heads, DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(sum(extend), heads, DIM, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, *torch.tensor(extend).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    lens = torch.tensor([p + n for p, n in zip(prefix, extend)], dtype=torch.int32, device="cuda")
    rows = torch.arange(len(prefix), dtype=torch.int32, device="cuda")
    out = paged_extend(q, k, v, pages, rows, lens, cu, max(extend), PAGE, DIM**-0.5, tiling=tiling, tma=tma)
    ref = reference(q, k, v, pages, prefix, extend)
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def anchor_us(step: PrefillStep, heads: int, kv_heads: int, backend: SDPBackend) -> float:
    """SDPA on the step's work laid out contiguously: [B, H, N, D] queries over [B, H, P+N, D] keys."""
    b, n, total = step.requests, step.tokens, step.prefix + step.tokens
    q = torch.randn(b, heads, n, DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(b, heads, total, DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    mask = causal_lower_right(n, total)
    with sdpa_kernel(backend):
        return median_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 20, 200)


def rows_for(model: str, steps: list[PrefillStep], variants: list[tuple[Tiling, bool | None]]) -> list[dict]:
    """variants: (tiling, tma) pairs; tma None is paged_extend's choice, False pointer loads."""
    heads, kv_heads = MODELS[model]
    errors = {}
    for variant in variants:
        try:
            errors[variant] = check(*variant, heads, kv_heads)
        except Exception as e:  # noqa: BLE001 - a tiling the compiler refuses is reported, not fatal
            errors[variant] = f"{type(e).__name__}: {str(e)[:80]}"
    out = []
    for step in steps:
        flops = heads * attention_flops(1, DIM, step.tokens, step.prefix) * step.requests
        anchors = {}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                anchors[name] = anchor_us(step, heads, kv_heads, backend)
            except Exception as e:  # noqa: BLE001
                print(f"{model} {step}: SDPA {name} failed: {type(e).__name__}: {str(e)[:120]}")
        best_anchor = min(anchors.values()) if anchors else None
        args = paged_setup(step, heads, kv_heads)
        q, k, v, pages, rows, lens, cu = args
        for variant in variants:
            tiling, tma = variant
            row = {"model": model, "step": str(step),
                   "tiling": str(tiling or f"default {extend_tiling(heads // kv_heads, DIM, 2)}"),
                   "loads": "pointers" if tma is False else "TMA where it fits"}
            if isinstance(errors[variant], str):
                out.append({**row, "error": errors[variant]})
                continue
            try:
                us = median_us(lambda: paged_extend(q, k, v, pages, rows, lens, cu, step.tokens, PAGE, DIM**-0.5,
                                                     tiling=tiling, tma=tma), 20, 200)
            except Exception as e:  # noqa: BLE001
                out.append({**row, "error": f"{type(e).__name__}: {str(e)[:80]}"})
                continue
            row.update({"max rel err": errors[variant], "ms": us / 1e3, "TFLOP/s": flops / us / 1e6})
            for name, a in anchors.items():
                row[f"SDPA {name} ms"] = a / 1e3
            if best_anchor:
                row["vs best SDPA"] = best_anchor / us
            out.append(row)
            print(row)
        del args, q, k, v
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="16x1024@16384,16x1024,2x8192@8192")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--quick", action="store_true", help="the default tiling only (TMA and pointers)")
    args = ap.parse_args()
    torch.manual_seed(0)
    steps = [PrefillStep.parse(s) for s in args.steps.split(",")]
    variants = [(None, None), (None, False)] + ([] if args.quick else [(t, None) for t in TILINGS])
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for model in args.models.split(","):
        try:
            result["rows"] += rows_for(model, steps, variants)
        except Exception:  # noqa: BLE001 - keep the other model's figures
            traceback.print_exc()
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "bench_extend_attention.json"), "w") as f:
                json.dump(result, f, indent=1, default=str)
    print(table(result["rows"], f"Paged extend attention vs SDPA ({result['device']}, torch {result['torch']})"))


if __name__ == "__main__":
    main()
