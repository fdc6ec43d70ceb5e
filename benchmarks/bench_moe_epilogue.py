"""The MoE block's epilogue at Qwen3.5-122B shapes (H=3072, top-8 over 256 experts), bf16: the
combine, then the gated shared expert added by torch (sigmoid, broadcast multiply, add: before),
against the combine that adds it in its own pass (after; the sigmoid still a [T, 1] torch op).

    python benchmarks/bench_moe_epilogue.py [--tokens 16384,4096,256,16]

Medians of triton's do_bench (L2 flushed); prints a markdown table, and checks the two agree bit for bit.
"""
from __future__ import annotations

import argparse

import torch

from gpu_timing import median_us, table
from minisgl.kernels.moe_gemm import moe_combine
from minisgl.moe.shared_addend import SharedAddend

H, E, K = 3072, 256, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="16384,4096,256,16")
    rows = []
    for t in map(int, parser.parse_args().tokens.split(",")):
        y = torch.randn(t * K, H, device="cuda", dtype=torch.bfloat16)
        ids = torch.rand(t, E, device="cuda").topk(K, dim=-1).indices
        addend = SharedAddend(torch.randn(t, H, device="cuda", dtype=torch.bfloat16),
                              torch.randn(t, 1, device="cuda", dtype=torch.bfloat16))
        before = lambda: addend.add_to(moe_combine(y, ids, E, torch.bfloat16))  # noqa: E731
        after = lambda: moe_combine(y, ids, E, torch.bfloat16, addend.out, addend.scale())  # noqa: E731
        assert torch.equal(before(), after()), f"T={t}: the fused epilogue is not torch's bit for bit"
        us = {"combine alone": median_us(lambda: moe_combine(y, ids, E, torch.bfloat16)),
              "before (combine + torch epilogue)": median_us(before), "after (fused)": median_us(after)}
        rows.append({"T": t, **us, "saved per layer us": us["before (combine + torch epilogue)"] - us["after (fused)"]})
    print(table(rows, "MoE epilogue, bf16, H=3072, top-8 of 256"))


if __name__ == "__main__":
    main()
