"""The MoE grouping (kernels/moe_align.py) at prefill sizes on CUDA: 256 experts, top-8, uniform and
skewed routing, at the block size moe_gemm.regime picks (or --block-m); optionally against another
version of the module.

    PYTHONPATH=python python3 benchmarks/bench_moe_align.py [--baseline OLD_MOE_ALIGN.py]

(e.g. `git show REV:python/minisgl/kernels/moe_align.py > /tmp/moe_align_old.py`). Two timings a
path, in us: `graph` is triton.testing.do_bench_cudagraph (calls back to back in a CUDA graph: the
device time, as a piecewise graph replays it), `bench` is do_bench (each call launched from Python,
L2 flushed before it). With a baseline, each grouping is first checked against it: the same block
table and the same pairs per expert.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from types import ModuleType

import torch
import triton

from minisgl.kernels import moe_align
from minisgl.kernels.moe_gemm import regime

E, TOP_K, HOT = 256, 8, 4


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("moe_align_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves string annotations through it
    spec.loader.exec_module(module)
    return module


def routing(t: int, skewed: bool) -> torch.Tensor:
    """Distinct top-8 experts per token, as a router gives them; skewed: the same 4 experts in every
    token's top-8 (half the pairs on 4 experts)."""
    logits = torch.rand(t, E, device="cuda")
    if skewed:
        logits[:, torch.randperm(E, device="cuda")[:HOT]] += 1
    return logits.topk(TOP_K, dim=-1).indices


def grouped(g) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # noqa: ANN001 - either module's grouping
    """(block_expert, block_rows, the real rows as expert * 2^32 + pair, sorted)."""
    real = torch.arange(g.block_m, device="cuda")[None, :] < g.block_rows[:, None]
    expert = g.block_expert[:, None].expand_as(real)[real].long()
    pair = g.rows.view(-1, g.block_m)[real].long()
    return g.block_expert, g.block_rows, ((expert << 32) + pair).sort().values


def times_us(module: ModuleType, ids: torch.Tensor, block_m: int) -> tuple[float, float]:
    def run() -> None:
        module.align_experts(ids, E, block_m)
    return (triton.testing.do_bench_cudagraph(run, return_mode="median") * 1e3,
            triton.testing.do_bench(run, return_mode="median") * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="another moe_align.py to check against and time beside this one")
    ap.add_argument("--tokens", default="16384,4096")
    ap.add_argument("--block-m", default="", help="comma-separated block sizes (default: the regime's at each size)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    baseline = load(args.baseline) if args.baseline else None
    torch.manual_seed(0)
    print("| tokens | block_m | routing | graph us | bench us |" + (" baseline graph us | baseline bench us |"
                                                                   if baseline else ""))
    print("|---" * (7 if baseline else 5) + "|")
    for t in (int(v) for v in args.tokens.split(",")):
        for skewed in (False, True):
            ids = routing(t, skewed)
            for block_m in [int(v) for v in args.block_m.split(",") if v] or [regime(t * TOP_K, E).block_m]:
                if baseline is not None:
                    new, old = grouped(moe_align.align_experts(ids, E, block_m)), grouped(
                        baseline.align_experts(ids, E, block_m))
                    if not all(torch.equal(a, b) for a, b in zip(new, old)):
                        raise SystemExit(f"{t} tokens, block_m {block_m}: the groupings differ")
                row = [*times_us(moe_align, ids, block_m)]
                if baseline is not None:
                    row += times_us(baseline, ids, block_m)
                print(f"| {t} | {block_m} | {'skewed' if skewed else 'uniform'} | "
                      + " | ".join(f"{v:.1f}" for v in row) + " |")


if __name__ == "__main__":
    main()
