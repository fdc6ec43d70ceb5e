"""The Triton MoE (align, grouped gate/up + SwiGLU, grouped down, combine) against torch on fresh
random routing and weights, FP8 and BF16, at tiny, 122B (decode and prefill) and 397B shapes; its
CUDA-graph replay; and that a new token count compiles nothing new.

Tolerances, as max |err| / max |ref| over the [T, H] output:
- FP8 EMULATED against fp32 torch on the same FP8 operands (activations quantised by the kernels'
  rule before each GEMM): 1e-2 for the bf16 roundings of each pair's y and of the output (2^-9
  each; 3.9e-3 measured with exact products, on the interpreter), plus the largest move one e4m3
  step of one element of h makes, computed from the data (_one_step_of_h). h is rounded to bf16
  and quantised again between the GEMMs, so where the kernel's h and the reference's straddle an
  e4m3 rounding midpoint their codes are one step apart; Hopper's FP8 MMA keeps ~13 bits of its
  sums, which puts ~2% of h's elements there (a model of that accumulation, against exact fp32:
  ~2e4 of 1e6 elements at T=900, E=6, I=384). One step is 1/16-1/8 of an element, and moves the
  output by p * step * W_down[:, i]. The steps point both ways: in that model (40 draws at T=900
  and 300 with H=320, I=384 and T=33 with H=192, I=96; 13- and 12-bit sums) the error stayed under
  this bound every time, at most 2.8e-2 of max |ref| against bounds of 3.5-6.6e-2; the H200
  measured 2.41e-2 at T=900, where the old flat 2e-2 ignored the steps. The same data go through
  every path, and on the interpreter (exact products, the GPU's roundings) every path's output was
  bit for bit the same.
- FP8 PLAIN 8e-2 against bf16 activations on the dequantised weights: two FP8 activation
  roundings in series (about 2.5% rms each, see test_fp8_linear.py).
- BF16 2e-2 against fp32 torch on the same bf16 weights: h and the output are rounded to bf16.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from fp8_refs import DEVICE, moe_reference, poison_allocator, quantize_acts, rel_err
from kernel_checks import captured

pytest.importorskip("triton")

from minisgl.kernels import moe_align, moe_gemm, moe_gemm_large
from minisgl.kernels.fp8_quant import _quantize_groups_kernel
from minisgl.kernels.moe_align import align_experts
from minisgl.kernels.moe_gemm import regime, rows_bucket
from minisgl.layers.fp8 import FP8_DTYPE, cdiv, dequantize_block_fp8, dequantize_gate_up, quantize_block_fp8
from minisgl.kernels.moe_deep_gemm import unavailable_reason, worth_it
from minisgl.moe.triton_experts import TritonExperts

pytestmark = pytest.mark.gpu

FP8_ROUNDING, FP8_PLAIN, BF16_TOL = 1e-2, 8e-2, 2e-2
# (T, E, k, H, I): tiny model, 122B at decode batches 16/64/256 and prefill chunks of 2K and 6K
# tokens (the decode kernels at 64 rows per block; the large-M ones; the split align), 397B, ragged
# sizes (the last on the large-M kernels, as REGIMES picks them from 128 rows per expert on).
SHAPES = [
    (5, 8, 2, 128, 64),
    (16, 256, 8, 3072, 1024),
    (64, 256, 8, 3072, 1024),
    (256, 256, 8, 3072, 1024),
    (2048, 256, 8, 3072, 1024),
    (6000, 256, 8, 3072, 1024),
    (16, 512, 10, 4096, 1024),
    (33, 6, 3, 192, 96),
    (900, 6, 3, 320, 384),
]


def _random_weight(*shape: int, fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random codes with random positive block scales (FP8), or bf16 weights, std ~ 1/sqrt(fan_in)."""
    fan_in = shape[-1]
    if not fp8:
        return (torch.randn(shape, device=DEVICE) / fan_in**0.5).to(torch.bfloat16), None
    codes = torch.empty(shape, dtype=FP8_DTYPE, device=DEVICE)
    for e in range(shape[0]):  # expert by expert: no full-size temporary
        codes[e] = torch.randn(shape[1:], device=DEVICE, dtype=torch.bfloat16)
    blocks = (shape[0], cdiv(shape[1], 128), cdiv(shape[2], 128))
    scale = torch.rand(blocks, device=DEVICE).add(0.5) / fan_in**0.5
    return codes, scale


def _gate_up(e: int, h: int, i: int, fp8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    gate, gs = _random_weight(e, i, h, fp8=fp8)
    up, us = _random_weight(e, i, h, fp8=fp8)
    return torch.cat([gate, up], dim=1), None if gs is None else torch.cat([gs, us], dim=1)


def _routing(t: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(t, e, device=DEVICE).topk(k, dim=-1).indices
    if t > 3:
        ids[0, 0] = -1  # padding
        ids[1, :] = -1  # a token with no pair here: zero output
        ids[2, k - 1] = e  # another worker's expert
    weights = torch.rand(t, k, device=DEVICE).softmax(-1).to(torch.bfloat16)
    return ids, weights


def _e4m3_step(codes: torch.Tensor) -> torch.Tensor:
    """The e4m3 step at each code: 2^(exponent - 3) (3 mantissa bits), 2^-9 among the subnormals."""
    return torch.exp2(torch.floor(torch.log2(codes.float().abs().clamp_min(2.0**-6))) - 3)


def _one_step_of_h(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor,
                   weights: torch.Tensor, gate_up_scale: torch.Tensor, down_scale: torch.Tensor) -> float:
    """The largest output move of one e4m3 step of one element of h: max over the pairs and h's
    elements i of p * step_i * max_n |W_down[n, i]|, h and its steps as the emulated reference has them."""
    worst = 0.0
    for e in ids[(ids >= 0) & (ids < gate_up.shape[0])].unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        g, u = (quantize_acts(x[tok]) @ dequantize_gate_up(gate_up[e], gate_up_scale[e]).T).chunk(2, dim=-1)
        codes, scales = quantize_block_fp8((F.silu(g) * u).to(x.dtype).float(), (1, 128))
        step = _e4m3_step(codes) * scales.repeat_interleave(128, dim=1)[:, : codes.shape[1]]
        column = dequantize_block_fp8(down[e], down_scale[e]).abs().amax(dim=0)
        worst = max(worst, (step * column * weights[tok, slot, None].float()).max().item())
    return worst


def _assert_matches_reference(out: torch.Tensor, args: tuple, fp8: bool) -> None:
    if fp8:
        ref = moe_reference(*args, emulate=True)
        bound = FP8_ROUNDING + _one_step_of_h(*args) / ref.abs().max().item()
        assert rel_err(out, ref) <= bound
        assert rel_err(out, moe_reference(*args, emulate=False)) <= FP8_PLAIN
    else:
        assert rel_err(out, moe_reference(*args, emulate=False)) <= BF16_TOL


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("t,e,k,h,i", SHAPES)
def test_triton_experts_match_torch(t: int, e: int, k: int, h: int, i: int, fp8: bool) -> None:
    torch.manual_seed(t + e + k + h + i + fp8)
    gate_up, gate_up_scale = _gate_up(e, h, i, fp8)
    down, down_scale = _random_weight(e, h, i, fp8=fp8)
    x = torch.randn(t, h, dtype=torch.bfloat16, device=DEVICE)
    ids, weights = _routing(t, e, k)
    poison_allocator()
    out = TritonExperts().forward(x, gate_up, down, ids, weights, gate_up_scale, down_scale)
    assert out.shape == x.shape and out.dtype == x.dtype
    _assert_matches_reference(out, (x, gate_up, down, ids, weights, gate_up_scale, down_scale), fp8)
    if t > 3:
        assert torch.equal(out[1], torch.zeros_like(out[1]))


# (rows per block, gate_up override, down override): every orientation and epilogue, whatever
# REGIMES holds (tests/kernels/test_moe_interpret.py checks them stage by stage). An override replaces
# fields of the regime's tile, so each path names the fields the prefill regime sets (tma, codes_in_halves).
PATHS = [
    (64, dict(large_m=False, block_n=64, num_warps=4, num_stages=4), dict(large_m=False, block_n=128, num_warps=8)),
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=False, codes_in_halves=False),
     dict(large_m=True, block_n=128, num_warps=4, tma=False)),
    (64, dict(large_m=True, block_n=128, num_warps=4, tma=False), dict(large_m=True, block_n=256, num_warps=8, tma=False)),
    (128, dict(large_m=True, block_n=128, num_warps=8, tma=False), dict(large_m=True, block_n=128, num_warps=8, tma=False)),
    # operands through TMA: tiles with h in bf16, and ones with h quantised in gate_up's epilogue
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=True, codes_in_halves=False),
     dict(large_m=True, block_n=128, num_warps=4, tma=True)),
    (128, dict(large_m=True, block_n=128, num_warps=8, tma=True), dict(large_m=True, block_n=128, num_warps=8, tma=True)),
    (64, dict(large_m=True, block_n=128, num_warps=4, tma=True), dict(large_m=True, block_n=64, num_warps=4, tma=True)),
    # h quantised by 64-column tiles, a program running both halves of a 128-group
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=True, codes_in_halves=True),
     dict(large_m=True, block_n=128, num_warps=4, tma=True)),
    (64, dict(large_m=True, block_n=64, num_warps=4, tma=False, codes_in_halves=True),
     dict(large_m=True, block_n=128, num_warps=4, tma=False)),
]


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "bf16"])
@pytest.mark.parametrize("block_m,gate_up_tile,down_tile", PATHS)
@pytest.mark.parametrize("t,e,k,h,i", [(2048, 256, 8, 3072, 1024), (900, 6, 3, 320, 384), (700, 5, 2, 384, 320)])
def test_each_path_matches_torch(t: int, e: int, k: int, h: int, i: int, block_m: int, gate_up_tile: dict,
                                 down_tile: dict, fp8: bool) -> None:
    torch.manual_seed(t + e + k + h + i + fp8)  # the same data for every path
    gate_up, gate_up_scale = _gate_up(e, h, i, fp8)
    down, down_scale = _random_weight(e, h, i, fp8=fp8)
    x = torch.randn(t, h, dtype=torch.bfloat16, device=DEVICE)
    ids, weights = _routing(t, e, k)
    ids[ids == e - 1] = 0  # an expert with no rows
    poison_allocator()
    g = align_experts(ids, e, block_m)
    hidden = moe_gemm.moe_gate_up(x, gate_up, gate_up_scale, g, **gate_up_tile)
    y = moe_gemm.moe_down(hidden, down, down_scale, weights, g, **down_tile)
    out = moe_gemm.moe_combine(y, ids, e, x.dtype)
    _assert_matches_reference(out, (x, gate_up, down, ids, weights, gate_up_scale, down_scale), fp8)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
@pytest.mark.parametrize(
    "t,k,e", [(1, 8, 256), (64, 8, 256), (700, 8, 256), (4096, 8, 256), (16384, 8, 256), (37, 10, 512),
              (300, 2, 6), (50, 4, 384), (3000, 3, 6), (5000, 1, 1), (3000, 2, 2), (1100, 8, 5000)],
)
def test_align_groups_every_valid_pair_once(t: int, k: int, e: int, skewed: bool) -> None:
    """Every valid pair once, in its expert's blocks; past moe_align.ONE_PROGRAM_PAIRS (the split
    path) each expert's rows in increasing pair index. Skewed: half the pairs on 3 experts."""
    torch.manual_seed(t * k + e)
    ids = torch.randint(-1, e + 2, (t, k), device=DEVICE)  # includes -1 and ids >= E
    if skewed:
        hot = torch.randint(0, 3, (t, k), device=DEVICE)
        ids = torch.where(torch.rand(t, k, device=DEVICE) < 0.5, hot, ids)
    g = align_experts(ids, e, regime(t * k, e).block_m)
    block_expert, block_rows = g.block_expert.tolist(), g.block_rows.tolist()
    rows = g.rows.view(-1, g.block_m).tolist()
    flat = ids.flatten().tolist()
    seen, last = [], -1
    for b, (owner, n) in enumerate(zip(block_expert, block_rows)):
        if owner < 0:
            assert n == 0 and all(o < 0 for o in block_expert[b:]), "unused blocks come last"
            break
        assert owner >= last and 0 < n <= g.block_m
        last = owner
        pairs = rows[b][:n]
        assert all(flat[p] == owner for p in pairs)
        seen += pairs
    assert sorted(seen) == [p for p, x in enumerate(flat) if 0 <= x < e]
    if t * k > moe_align.ONE_PROGRAM_PAIRS:
        assert seen == sorted(seen, key=lambda p: (flat[p], p)), "the split path: rows in pair order"


def _deep_gemm_experts() -> TritonExperts:
    """The deep_gemm backend, or the test skipped with why it cannot run here."""
    reason = unavailable_reason(torch.device(DEVICE))
    if reason is not None:
        pytest.skip(reason)
    from minisgl.moe.deep_gemm_experts import DeepGemmExperts

    return DeepGemmExperts()


@pytest.mark.parametrize("t,e,k,h,i", [(4096, 64, 8, 3072, 1024), (1100, 6, 3, 384, 256)])
def test_deep_gemm_experts_match_torch(t: int, e: int, k: int, h: int, i: int) -> None:
    """The deep_gemm backend's prefill path (x's codes moved into grouped order, DeepGEMM's grouped
    GEMMs, SwiGLU by the Triton MoE's rule and h's codes in one pass over the real rows between them,
    the combine weighing rows read through pair_rows) under the FP8 bounds above: its gate_up output
    is also rounded to bf16 before SwiGLU."""
    experts = _deep_gemm_experts()
    torch.manual_seed(t + e + k)
    gate_up, gate_up_scale = _gate_up(e, h, i, True)
    down, down_scale = _random_weight(e, h, i, fp8=True)
    x = torch.randn(t, h, dtype=torch.bfloat16, device=DEVICE)
    ids, weights = _routing(t, e, k)
    assert worth_it(ids.numel(), e, x, gate_up), "the shape must take DeepGEMM's path"
    poison_allocator()
    out = experts.forward(x, gate_up, down, ids, weights, gate_up_scale, down_scale)
    assert out.shape == x.shape and out.dtype == x.dtype
    _assert_matches_reference(out, (x, gate_up, down, ids, weights, gate_up_scale, down_scale), True)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("t,backend", [(48, TritonExperts), (4096, TritonExperts), (16384, _deep_gemm_experts)],
                         ids=["decode kernels", "prefill kernels, TMA", "prefill on DeepGEMM"])
def test_graph_replay_matches_eager(t: int, backend: Callable[[], TritonExperts]) -> None:
    """A captured step replays on fresh inputs and routing as it runs eagerly: at 4096 tokens the
    large-M kernels, whose TMA descriptors (kernel arguments, by value) are captured with it; at
    16384 DeepGEMM's, built on the host at each call and captured the same way."""
    experts = backend()
    torch.manual_seed(5)
    e, k, h, i = 256, 8, 3072, 1024
    gate_up, gs = _gate_up(e, h, i, True)
    down, ds = _random_weight(e, h, i, fp8=True)
    x = torch.randn(t, h, dtype=torch.bfloat16, device=DEVICE)
    ids, weights = _routing(t, e, k)
    assert (backend is TritonExperts) != worth_it(ids.numel(), e, x, gate_up), "the case must take its path"
    run = lambda: experts.forward(x, gate_up, down, ids, weights, gs, ds)  # noqa: E731
    graph, out = captured(run)
    x.copy_(torch.randn_like(x))  # fresh inputs and routing, replayed through the same buffers
    new_ids, new_weights = _routing(t, e, k)
    ids.copy_(new_ids)
    weights.copy_(new_weights)
    graph.replay()
    assert torch.equal(out, run())


def _variants(kernel: object) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_token_counts_in_one_bucket_compile_once() -> None:
    """Per-step sizes (token and pair counts, block counts, the scales' token-major strides) must not
    specialise a kernel: counts with the same rows per block add no variant after the first."""
    torch.manual_seed(9)
    e, k, h, i = 64, 8, 256, 128
    gate_up, gs = _gate_up(e, h, i, True)
    down, ds = _random_weight(e, h, i, fp8=True)
    counts = [1100, 1101, 1200, 1233, 2047]  # 8 pairs each over 64 experts: 128 rows per block
    assert len({rows_bucket(t * k, e) for t in counts}) == 1
    kernels = [_quantize_groups_kernel, moe_gemm._moe_gate_up_kernel, moe_gemm._moe_down_kernel,
               moe_gemm_large._moe_gate_up_large_kernel, moe_gemm_large._moe_down_large_kernel,
               moe_gemm._moe_combine_kernel, moe_align._moe_align_kernel, moe_align._moe_sort_kernel,
               moe_align._moe_bases_kernel, moe_align._moe_place_kernel]
    before = None
    for t in counts:
        x = torch.randn(t, h, dtype=torch.bfloat16, device=DEVICE)
        ids, weights = _routing(t, e, k)
        TritonExperts().forward(x, gate_up, down, ids, weights, gs, ds)
        before = before or [_variants(kernel) for kernel in kernels]
    assert [_variants(kernel) for kernel in kernels] == before, f"token counts {counts} compiled new variants"
