"""The FP8 linear: activations quantised once (per call, or once for all the layers that read one
Activations: kernels/activations.py), then the GEMM that is fastest at this many tokens, chosen
from REGIMES by the token count's bucket (never by the exact count, so no step compiles a new
kernel):

- "split_k" (kernels/fp8_gemm.py): tokens as the MMA's narrow side, K split while the weight tiles
  are too few to fill the SMs; small decode batches, and long reductions over few output tiles.
- "tiled" (kernels/fp8_gemm_tiled.py): [BLOCK_M x BLOCK_N] output tiles, TMA optional; decode
  batches from 32 tokens.
- "cublas" (kernels/fp8_gemm_cublas.py): torch._scaled_mm's block-scaled recipe; where cuBLAS
  cannot run it (old torch or cuBLAS, or a weight shape it refuses), the regime's tile instead.

benchmarks/bench_prefill.py times every backend and tile per bucket and prints the winners, so a
new winner is a one-row change of REGIMES.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_gemm import gemm_split_k
from minisgl.kernels.fp8_gemm_cublas import cublas_block_scaling, cublas_fits, gemm_cublas
from minisgl.kernels.fp8_gemm_tiled import TileConfig, gemm_tiled

BACKENDS = ("split_k", "tiled", "cublas")


@dataclass(frozen=True)
class Regime:
    min_m: int  # the regime's first token count; it runs up to the next regime's
    backend: str
    tile: TileConfig | None = None  # "tiled"'s tile, and "cublas"'s fallback
    # Reductions longer than this (K) run on the split-K kernel instead: at these token counts the
    # regime's output tiles are one row of N / BLOCK_N programs, too few to keep the SMs loading for
    # a whole K loop, where split-K also splits K.
    split_k_above: int | None = None

    def backend_for(self, k: int) -> str:
        return "split_k" if self.split_k_above is not None and k > self.split_k_above else self.backend


# Decode batches from 32 tokens: the tiled kernel with TMA, 64 tokens x 128 weight rows. On the H200
# (benchmarks/bench_decode_linear.py, docs/benchmarks.md, 2026-12-04), with the quantiser, in CUDA
# graphs over cold weights, it took a decode step's projections from 3.16-4.43 to 2.87-3.88 ms on the
# 35B at 64-384 tokens and from 5.19-6.51 to 4.95-4.99 ms on the 122B at 64-128, the split-K kernel
# keeping the 122B's out_proj / o_proj (K 8192 over 3,072 rows) below 128 tokens, where it was
# 1.15x faster. From 512 tokens cuBLAS's block-scaled GEMM won every 122B projection (bench_prefill.py,
# 2026-12-03: 0.63 / 0.88 / 0.85 of the FP8 ceiling at 512 / 4096 / 16384 tokens, against 0.34 / 0.47
# / 0.48 for the tiles below); the tiles stay as its fallback.
DECODE_TILE = TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=4, tma=True)
REGIMES = (
    Regime(1, "split_k"),
    Regime(32, "tiled", DECODE_TILE, split_k_above=4096),
    Regime(128, "tiled", DECODE_TILE),
    Regime(512, "cublas", TileConfig(block_m=64, block_n=128, num_warps=4, num_stages=4)),
    Regime(2048, "cublas", TileConfig(block_m=128, block_n=128, num_warps=8, num_stages=3)),
)


def regime(m: int) -> Regime:
    return next(r for r in reversed(REGIMES) if m >= r.min_m)


def fp8_linear(
    x: torch.Tensor | Activations,  # [..., K] bf16 (or fp32); Activations to share its quantisation
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(N/128), ceil(K/128)] fp32
    backend: str | None = None,
    tile: TileConfig | None = None,
    **split_k_options: int,
) -> torch.Tensor:
    """x @ dequant(weight)^T in x's dtype. `backend`, `tile` and the split-K kernel's options
    (block_m, block_n, split_k, num_warps, num_stages) override the regime's choice (tests, benchmarks)."""
    acts = Activations.of(x)
    x = acts.x
    n, k = weight.shape
    if x.shape[-1] != k or weight.stride(1) != 1 or scale_inv.stride(1) != 1:
        raise ValueError(f"fp8_linear: x {tuple(x.shape)} vs weight {tuple(weight.shape)} (rows must be packed)")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"fp8_linear: backend {backend!r} is not one of {BACKENDS}")
    m = x.numel() // k
    if m == 0:
        return x.new_empty(*x.shape[:-1], n)
    chosen = regime(m)
    backend = backend or chosen.backend_for(k)
    tile = tile or chosen.tile or REGIMES[-1].tile
    xq, xs = acts.fp8()  # rows padded for cuBLAS; the Triton GEMMs take rows [:m]
    if backend == "cublas" and cublas_fits(weight, scale_inv) and cublas_block_scaling(x.device) is None:
        return gemm_cublas(xq, xs, weight, scale_inv, x.dtype)[:m].view(*x.shape[:-1], n)
    xq, xs = xq[:m], xs[:m]
    if backend in ("tiled", "cublas"):
        out = gemm_tiled(xq, xs, weight, scale_inv, x.dtype, tile)
    else:
        out = gemm_split_k(xq, xs, weight, scale_inv, x.dtype, **split_k_options)
    return out.view(*x.shape[:-1], n)
