"""The Triton MoE's GEMM kernels, both orientations (decode's, and prefill's large-M with and without
h quantised in gate_up's epilogue, by one tile or by two halves), stage by stage against torch at small ragged shapes, with
padding ids, another worker's ids, a token with no pair and an expert with no rows; and
align_experts' grouping, both paths, uniform and skewed, against torch. On a GPU, or on the CPU
through Triton's interpreter:

    TRITON_INTERPRET=1 python -m pytest -q tests/kernels/test_moe_interpret.py

(without triton, or on the CPU without TRITON_INTERPRET=1, the module is skipped with its reason).

Each stage is checked on the operands the kernels actually read (the quantiser's codes and scales),
so the check does not depend on how FP8 casts round: triton 3.6's interpreter rounds fp32 -> fp8
casts wrongly (-31.1 became -16) and multiplies bf16 tiles wrongly, so there the non-FP8 case runs
fp32 tensors and end-to-end FP8 accuracy is left to tests/gpu/test_moe_triton.py. Tolerance 1e-2 of
max |ref|: the same products in fp32, rounded once to the output's dtype (bf16: 2^-9 relative).
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
GPU = torch.cuda.is_available()
if not GPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU: set TRITON_INTERPRET=1 to run the Triton kernels on the CPU", allow_module_level=True)

from minisgl.kernels import moe_align  # noqa: E402
from minisgl.kernels.fp8_quant import GROUP, quantize_activations  # noqa: E402
from minisgl.kernels.moe_align import ExpertGrouping, align_experts  # noqa: E402
from minisgl.kernels.moe_gemm import Hidden, moe_combine, moe_down, moe_gate_up  # noqa: E402
from minisgl.layers.fp8 import FP8_DTYPE, cdiv, dequantize_block_fp8, dequantize_gate_up  # noqa: E402

DEVICE = "cuda" if GPU else "cpu"
PLAIN = torch.bfloat16 if GPU else torch.float32  # the interpreter's bf16 products are wrong (see above)
TOL = 1e-2
T, E, K_TOP, H, I = 40, 6, 3, 320, 192  # K = 320 and I = 192 leave partial 128-steps and tiles
# (rows per block, gate_up override, down override): decode's kernels, then prefill's large-M ones
# with h in the activations' dtype (block_n 64), quantised in gate_up's epilogue (128), down 256 wide,
# then with FP8 operands through TMA (in the non-FP8 case tma is unused: the pointer loops run).
PATHS = [
    (16, {}, {}),
    (16, dict(large_m=True, block_n=64, num_warps=4), dict(large_m=True, block_n=64, num_warps=4)),
    (32, dict(large_m=True, block_n=128, num_warps=4), dict(large_m=True, block_n=128, num_warps=4)),
    (64, dict(large_m=True, block_n=128, num_warps=8, group_m=2), dict(large_m=True, block_n=256, num_warps=8)),
    (16, dict(large_m=True, block_n=128, num_warps=4, tma=True), dict(large_m=True, block_n=128, num_warps=4, tma=True)),
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=True),
     dict(large_m=True, block_n=128, num_warps=4, tma=True)),
    # 64-column tiles, a program running both halves of a 128-group and quantising h
    (32, dict(large_m=True, block_n=64, num_warps=4, codes_in_halves=True), dict(large_m=True, block_n=128, num_warps=4)),
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=True, codes_in_halves=True),
     dict(large_m=True, block_n=128, num_warps=4, tma=True)),
]


def _weights(fp8: bool) -> tuple[torch.Tensor, ...]:
    def one(*shape: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not fp8:
            return (torch.randn(shape, device=DEVICE) / shape[-1] ** 0.5).to(PLAIN), None
        blocks = (shape[0], cdiv(shape[1], GROUP), cdiv(shape[2], GROUP))
        scale = torch.rand(blocks, device=DEVICE).add(0.5) / shape[-1] ** 0.5
        return torch.randn(shape, device=DEVICE).to(FP8_DTYPE), scale

    gate, gs = one(E, I, H)
    up, us = one(E, I, H)
    down, ds = one(E, H, I)
    return torch.cat([gate, up], 1), None if gs is None else torch.cat([gs, us], 1), down, ds


def _routing() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(T, E - 1, device=DEVICE).topk(K_TOP, dim=-1).indices  # expert E - 1 gets no rows
    ids[0, K_TOP - 1] = -1  # padding (pair 0 stays real: a stray store of an unused block lands there)
    ids[1, :] = -1  # a token with no pair here
    ids[2, K_TOP - 1] = E  # another worker's expert
    return ids, torch.rand(T, K_TOP, device=DEVICE).softmax(-1).to(PLAIN)


def _real_rows(g: ExpertGrouping) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions in grouped order, their experts, their pair ids) of the grouping's real rows."""
    pos, experts = [], []
    for b, (owner, n) in enumerate(zip(g.block_expert.tolist(), g.block_rows.tolist())):
        if owner >= 0:
            pos += range(b * g.block_m, b * g.block_m + n)
            experts += [owner] * n
    pos_t = torch.tensor(pos, device=DEVICE)
    return pos_t, torch.tensor(experts, device=DEVICE), g.rows[pos_t].long()


def _operand(x: torch.Tensor, fp8: bool) -> torch.Tensor:
    """What a GEMM reads of activations x, in fp32: the quantiser's codes times their scales for FP8."""
    if not fp8:
        return x.float()
    q, s = quantize_activations(x)
    return q.float() * s.repeat_interleave(GROUP, 1)[:, : x.shape[1]]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    assert not x.isnan().any()
    return ((x.float() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "plain"])
@pytest.mark.parametrize("block_m,gate_up_tile,down_tile", PATHS)
def test_stages_match_torch(block_m: int, gate_up_tile: dict, down_tile: dict, fp8: bool) -> None:
    torch.manual_seed(block_m + len(gate_up_tile) + fp8)
    gate_up, gs, down, ds = _weights(fp8)
    x = torch.randn(T, H, device=DEVICE).to(torch.bfloat16 if fp8 else PLAIN)
    ids, weights = _routing()
    g = align_experts(ids, E, block_m)
    pos, experts, pairs = _real_rows(g)
    w13 = torch.stack([dequantize_gate_up(gate_up[e], gs[e]) if fp8 else gate_up[e].float() for e in range(E)])
    w2 = torch.stack([dequantize_block_fp8(down[e], ds[e]) if fp8 else down[e].float() for e in range(E)])

    h: Hidden = moe_gate_up(x, gate_up, gs, g, **gate_up_tile)
    fused = fp8 and (gate_up_tile.get("block_n") == GROUP or gate_up_tile.get("codes_in_halves", False))
    assert isinstance(h, tuple) == fused, "h is quantised in the epilogue exactly when a program holds whole groups"
    if not fused:  # (the fused codes: test_epilogue_codes_are_the_quantisers)
        gate, up = torch.einsum("rh,rnh->rn", _operand(x, fp8)[pairs // K_TOP], w13[experts]).chunk(2, dim=-1)
        assert _rel(h[pos], F.silu(gate) * up) <= TOL

    y = moe_down(h, down, ds, weights, g, **down_tile)
    h_read = h[0].float() * h[1].repeat_interleave(GROUP, 1)[:, :I] if fused else _operand(h, fp8)
    y_ref = torch.einsum("ri,rni->rn", h_read[pos], w2[experts]) * weights.flatten()[pairs, None].float()
    assert _rel(y[pairs], y_ref) <= TOL

    out = moe_combine(y, ids, E, x.dtype)
    valid = ((ids >= 0) & (ids < E)).flatten()
    out_ref = torch.zeros(T, H, device=DEVICE).index_add_(0, pairs // K_TOP, y[pairs].float())
    assert valid.sum() == len(pairs) and _rel(out, out_ref) <= TOL
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_combine_reads_rows_elsewhere_and_weighs_them() -> None:
    """moe_combine with pair_rows and weights (kernels/moe_deep_gemm.py's output: unweighted rows in
    grouped order) sums the same as on rows in pair order already weighted, rounded as moe_down's
    epilogue rounds the product; skipped pairs' rows (garbage here) are never read."""
    torch.manual_seed(7)
    ids, weights = _routing()
    y_own = torch.randn(T * K_TOP, H, device=DEVICE).to(PLAIN)  # each pair's unweighted output, in pair order
    order = torch.randperm(T * K_TOP + 5, device=DEVICE)[: T * K_TOP]  # each pair's row, with spare rows
    y = torch.full((T * K_TOP + 5, H), float("nan"), device=DEVICE).to(PLAIN)
    y[order] = y_own
    valid = ((ids >= 0) & (ids < E)).flatten()
    y[order[~valid]] = float("nan")  # a skipped pair's row holds garbage
    out = moe_combine(y, ids, E, PLAIN, pair_rows=order.to(torch.int32), weights=weights)
    weighted = (y_own.float() * weights.flatten()[:, None].float()).to(PLAIN)
    ref = moe_combine(torch.where(valid[:, None], weighted, 0), ids, E, PLAIN)
    assert torch.equal(out, ref)
    assert not torch.equal(out, moe_combine(y_own, ids, E, PLAIN)), "the weights must change the sum"


# (the gate_up tile that writes h's codes, the tile writing h in bf16 whose quantised h it must match,
# whether the match is exact on a GPU too)
CODES_TILES = {
    "one 128-column tile": (dict(block_n=128), dict(block_n=64), False),
    "two 64-column halves": (dict(block_n=64, codes_in_halves=True), dict(block_n=64), True),
}


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("tiles", CODES_TILES.values(), ids=CODES_TILES.keys())
def test_epilogue_codes_are_the_quantisers(tiles: tuple[dict, dict, bool], tma: bool) -> None:
    """gate_up's in-epilogue quantisation writes exactly what quantize_activations writes for the h
    the large-M kernel writes in bf16 at 64 columns. A 128-column tile may sum a K step's products in
    another order on a GPU (codes one step apart there); the two halves are the 64-column tile's own
    arithmetic, exact everywhere. I = 192: with TMA a tile past I reads up's rows, which must not
    reach the group's scale."""
    fused, plain, exact = tiles
    torch.manual_seed(3)
    gate_up, gs, _, _ = _weights(True)
    x = torch.randn(T, H, dtype=torch.bfloat16, device=DEVICE)
    ids, _ = _routing()
    g = align_experts(ids, E, 32)
    tile = dict(large_m=True, num_warps=4, tma=tma)
    hq, hs = moe_gate_up(x, gate_up, gs, g, **tile, **fused)
    h = moe_gate_up(x, gate_up, gs, g, **tile, **plain)
    pos = _real_rows(g)[0]
    q, s = quantize_activations(h[pos])
    if GPU and not exact:
        assert _rel(hq[pos].float() * hs[pos].repeat_interleave(GROUP, 1)[:, :I],
                    q.float() * s.repeat_interleave(GROUP, 1)[:, :I]) <= 0.05
    else:
        assert torch.equal(hs[pos], s)
        assert torch.equal(hq[pos].view(torch.uint8), q.view(torch.uint8))


def test_weights_tma_cannot_read_take_pointer_loads(caplog: pytest.LogCaptureFixture) -> None:
    """A tile that asks for TMA over weights TMA cannot read (here a strided view, as a slice of a
    wider tensor would be) computes the same h through pointer loads, and the log says so."""
    torch.manual_seed(4)
    gate_up, gs, _, _ = _weights(True)
    x = torch.randn(T, H, dtype=torch.bfloat16, device=DEVICE)
    ids, _ = _routing()
    g = align_experts(ids, E, 32)
    wide = torch.zeros(E, 2 * I, H + 16, dtype=gate_up.dtype, device=DEVICE)
    wide[:, :, :H] = gate_up
    strided = wide[:, :, :H]
    tile = dict(large_m=True, block_n=64, num_warps=4, tma=True)
    with caplog.at_level("INFO", logger="minisgl.kernels.moe_gemm_large"):
        h = moe_gate_up(x, strided, gs, g, **tile)
    assert "not TMA-readable" in caplog.text
    pos = _real_rows(g)[0]
    assert torch.equal(h[pos], moe_gate_up(x, gate_up, gs, g, **tile)[pos])


# (tokens, top-k, experts, rows per block, routing), each a few chunks of moe_align.CHUNK pairs (the
# interpreter sorts a chunk in ~2 s): below ONE_PROGRAM_PAIRS, so the split path runs them forced.
ALIGN_CASES = [
    (300, 8, 256, 64, "uniform"),
    (300, 8, 256, 16, "skewed"),
    (300, 8, 256, 128, "skewed"),
    (300, 8, 2048, 32, "uniform"),  # phase 2 walks 3 chunks' counts 2 a tile, and its blocks in 3 tiles
    (400, 5, 6, 32, "skewed"),  # fewer histogram bins than a warp has lanes
    (200, 10, 384, 64, "uniform"),  # E not a power of two
]


def _align_ids(t: int, k: int, e: int, routing: str) -> torch.Tensor:
    """Random ids, skewed ones 80% on 3 hot experts, with padding (-1, and the first 3 tokens whole)
    and other workers' ids (>= E, some past int32: a cast before the range check would wrap them)."""
    ids = torch.randint(0, e, (t, k), device=DEVICE)
    if routing == "skewed":
        hot = torch.randperm(e, device=DEVICE)[:3]
        pick = hot[torch.randint(0, 3, (t, k), device=DEVICE)]
        ids = torch.where(torch.rand(t, k, device=DEVICE) < 0.8, pick, ids)
    ids[torch.rand(t, k, device=DEVICE) < 0.05] = -1
    ids[torch.rand(t, k, device=DEVICE) < 0.05] = e + 1
    ids[torch.rand(t, k, device=DEVICE) < 0.02] = 2**32 + 1
    ids[:3] = -1
    return ids


def _check_align(t: int, k: int, e: int, block_m: int, routing: str, in_pair_order: bool) -> None:
    """The block table as a stable sort by expert gives it, and each expert's pairs once from its
    first row on (in increasing pair index if in_pair_order)."""
    torch.manual_seed(t + k + e + block_m)
    ids = _align_ids(t, k, e, routing)
    g = align_experts(ids, e, block_m)

    flat = ids.flatten()
    counts = torch.bincount(flat[(flat >= 0) & (flat < e)], minlength=e)
    blocks = cdiv(counts, block_m)
    owner = torch.repeat_interleave(torch.arange(e, device=DEVICE), blocks)
    first = (blocks.cumsum(0) - blocks) * block_m
    nth = torch.arange(len(owner), device=DEVICE) - first[owner] // block_m
    nb = g.max_blocks
    assert nb == moe_align.max_blocks(t * k, e, block_m) and len(owner) <= nb
    pad = torch.full((nb - len(owner),), -1, device=DEVICE)
    assert torch.equal(g.block_expert.long(), torch.cat([owner, pad]))
    rows = torch.clamp(counts[owner] - nth * block_m, max=block_m)
    assert torch.equal(g.block_rows.long(), torch.cat([rows, torch.zeros_like(pad)]))
    for x in range(e):
        pairs = (flat == x).nonzero()[:, 0]
        got = g.rows[first[x] : first[x] + counts[x]].long()
        assert torch.equal(got if in_pair_order else got.sort().values, pairs), f"expert {x}"


@pytest.mark.parametrize("split", [False, True], ids=["one program", "split"])
@pytest.mark.parametrize("t,k,e,block_m,routing", ALIGN_CASES)
def test_align_matches_torch(t: int, k: int, e: int, block_m: int, routing: str, split: bool,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Both paths; the split path's rows in increasing pair index, as its docstring promises."""
    if split:
        monkeypatch.setattr(moe_align, "ONE_PROGRAM_PAIRS", 0)
    _check_align(t, k, e, block_m, routing, in_pair_order=split)


def test_align_splits_past_one_program() -> None:
    """Just past ONE_PROGRAM_PAIRS (5 chunks) the split path runs unforced."""
    assert 520 * 8 > moe_align.ONE_PROGRAM_PAIRS
    _check_align(520, 8, 256, 64, "skewed", in_pair_order=True)
