"""Block-scaled FP8 GEMM on cuBLAS: torch._scaled_mm with 1x128 activation scales and 128x128 weight
scales (cuBLAS >= 12.9 on sm90; torch infers the recipe from the scales' shapes and strides).

It takes our layouts as they are: the activation scales token-major ([M, K/128] with stride
(1, M), what kernels/fp8_quant.py writes), the weight's [N/128, K/128] scales transposed as a view.
cuBLAS also wants N and K multiples of 16, the weight scales' rows 16-byte aligned (K/128 a
multiple of 4) and the activation scales' columns too (M a multiple of ROWS_MULTIPLE: on the H200,
2026-12-03, M = 4133 gave CUBLAS_STATUS_NOT_SUPPORTED where 16 and 300 ran), so the caller pads M
(kernels/fp8_quant.py's rows_multiple); `cublas_fits` says whether a weight qualifies, and
`cublas_block_scaling` whether this torch and device run the recipe at all.
"""
from __future__ import annotations

from functools import lru_cache

import torch


ROWS_MULTIPLE = 4  # fp32 activation scales per 16 bytes


def cublas_fits(weight: torch.Tensor, scale_inv: torch.Tensor) -> bool:
    n, k = weight.shape
    return n % 16 == 0 and k % 16 == 0 and scale_inv.shape[1] % 4 == 0 and scale_inv.is_contiguous()


@lru_cache(maxsize=None)
def cublas_block_scaling(device: torch.device) -> str | None:
    """None when torch._scaled_mm runs the 1x128 x 128x128 recipe on `device`, else why not."""
    if device.type != "cuda":
        return "not a CUDA device"
    m, n, k = 64, 128, 512
    xq = torch.ones(m, k, device=device).to(torch.float8_e4m3fn)
    w = torch.ones(n, k, device=device).to(torch.float8_e4m3fn)
    xs = torch.ones(k // 128, m, device=device).t()
    ws = torch.ones(n // 128, k // 128, device=device)
    try:
        out = gemm_cublas(xq, xs, w, ws, torch.bfloat16)
    except (RuntimeError, NotImplementedError, ValueError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not bool((out == k).all()):
        return f"wrong result: {out.float().mean().item()} for {k}"
    return None


def gemm_cublas(
    xq: torch.Tensor,  # [M, K] float8_e4m3fn
    xs: torch.Tensor,  # [M, ceil(K/128)] fp32, token-major
    weight: torch.Tensor,  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor,  # [ceil(N/128), ceil(K/128)] fp32, contiguous
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale_inv.t(), out_dtype=out_dtype)
