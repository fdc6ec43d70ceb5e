"""grouped_codes against the grouping it inverts: every routed pair's row holds its token's codes and
scales bit for bit, names the pair's expert, and is the row pair_rows gives; padding rows name -1;
skipped pairs (padding ids, another worker's) get -1. Random codes and scales, ragged shapes (H of
40 8-byte words, 3 scale groups), blocks of 16 rows and of DeepGEMM's 128, codes with rows past T
and scales token-major as the quantiser leaves them. On a GPU, or on the CPU through Triton's
interpreter:

    TRITON_INTERPRET=1 python -m pytest -q tests/kernels/test_moe_grouped_codes.py
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
GPU = torch.cuda.is_available()
if not GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU: set TRITON_INTERPRET=1 to run the Triton kernels on the CPU", allow_module_level=True)

from minisgl.kernels.moe_align import align_experts  # noqa: E402
from minisgl.kernels.moe_grouped_codes import grouped_codes  # noqa: E402

DEVICE = "cuda" if GPU else "cpu"
T, T_PADDED, E, K_TOP, H = 37, 48, 6, 3, 320


def _routing(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K_TOP] for _ in range(T)])
    ids[3] = -1  # a token with no pair
    ids[5, 1] = E + 2  # another worker's expert
    ids[7:12, 0] = 2  # a busier expert
    return ids.to(DEVICE)


@pytest.mark.parametrize("block_m", [16, 128])
def test_each_pair_row_holds_its_tokens_codes(block_m: int) -> None:
    gen = torch.Generator().manual_seed(block_m)
    ids = _routing(block_m)
    codes = (torch.randn(T_PADDED, H, generator=gen) * 40).to(torch.float8_e4m3fn).to(DEVICE)
    scales = torch.rand(H // 128 + 1, T_PADDED, generator=gen).add(0.1).to(DEVICE).t()  # token-major
    g = align_experts(ids, E, block_m)
    (out, out_scales), row_expert, pair_rows = grouped_codes(codes, scales, g, T)

    m = g.max_blocks * block_m
    assert out.shape == (m, H) and out_scales.shape == (m, scales.shape[1]) and row_expert.shape == (m,)
    valid = ((ids >= 0) & (ids < E)).flatten().cpu()
    rows = pair_rows.cpu().long()
    assert (rows[~valid] == -1).all()
    real_rows = rows[valid]
    assert real_rows.unique().numel() == int(valid.sum())  # one row a pair
    pairs = torch.nonzero(valid).flatten()
    assert torch.equal(g.rows.cpu().long()[real_rows], pairs)  # the grouping's own row of each pair
    assert torch.equal(row_expert.cpu().long()[real_rows], ids.flatten().cpu()[pairs])
    padding = torch.ones(m, dtype=torch.bool)
    padding[real_rows] = False
    assert (row_expert.cpu()[padding] == -1).all()
    tokens = (pairs // K_TOP).to(DEVICE)
    assert torch.equal(out.view(torch.uint8)[real_rows.to(DEVICE)], codes.view(torch.uint8)[tokens])
    assert torch.equal(out_scales[real_rows.to(DEVICE)], scales[tokens])


def test_rows_of_other_than_whole_words_are_refused() -> None:
    ids = _routing(0)
    codes = torch.zeros(T, 132, dtype=torch.float8_e4m3fn, device=DEVICE)
    with pytest.raises(ValueError, match="8-byte words"):
        grouped_codes(codes, torch.ones(T, 2, device=DEVICE), align_experts(ids, E, 16), T)
