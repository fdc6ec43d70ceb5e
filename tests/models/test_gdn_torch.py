"""TorchGDNBackend against transformers' own torch GDN functions (fp32), plus varlen/slot/dtype behaviour.

Tolerances: fp32 comparisons use max|diff| / max|ref| <= 1e-5; bf16 inputs (fp32 state) <= 1e-2, bf16 state <= 3e-2.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    causal_conv1d_fn,
    causal_conv1d_update,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.forward_batch import StateFlow
from minisgl.gdn.prefill_states import delta_prefill
from minisgl.gdn.registry import GDN_BACKENDS

FP32_TOL = 1e-5
BF16_TOL = 1e-2
BF16_STATE_TOL = 3e-2

CONV_DIM, WIDTH = 24, 4
H, HV, K, V = 2, 4, 16, 32
NUM_SLOTS = 9


def rel_err(x: Tensor, ref: Tensor) -> float:
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def cu_seqlens_of(lengths: list[int]) -> Tensor:
    return F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32)


@pytest.fixture
def backend():
    return GDN_BACKENDS.get("torch")()


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def gdn_inputs(total: int, dtype: torch.dtype = torch.float32) -> DeltaInputs:
    # A spread from mild to strong decay so the initial state matters over long and short ranges.
    return DeltaInputs(
        q=torch.randn(total, H, K, dtype=dtype),
        k=torch.randn(total, H, K, dtype=dtype),
        v=torch.randn(total, HV, V, dtype=dtype),
        a=torch.randn(total, HV, dtype=dtype),
        b=torch.randn(total, HV, dtype=dtype),
        A_log=torch.linspace(0.01, 1.5, HV).log(),
        dt_bias=torch.randn(HV),
    )


def token_rows(inp: DeltaInputs, index) -> DeltaInputs:
    """Select tokens from the per-token inputs; the per-head parameters A_log, dt_bias pass through."""
    return replace(inp, q=inp.q[index], k=inp.k[index], v=inp.v[index], a=inp.a[index], b=inp.b[index])


def hf_gates(inp: DeltaInputs) -> tuple[Tensor, Tensor]:
    g = -inp.A_log.float().exp() * F.softplus(inp.a.float() + inp.dt_bias)
    return g, inp.b.float().sigmoid()


def hf_delta(fn, inp: DeltaInputs, s: int, e: int, state: Tensor) -> tuple[Tensor, Tensor]:
    """Run a transformers delta-rule function on tokens [s, e) as a batch of one."""
    g, beta = hf_gates(inp)
    out, final = fn(
        inp.q[None, s:e], inp.k[None, s:e], inp.v[None, s:e], g=g[None, s:e], beta=beta[None, s:e],
        initial_state=state[None].clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return out[0], final[0]


# ---------------------------------------------------------------- conv


def test_conv_prefill_varlen(backend) -> None:
    lengths, slots = [1, 2, 3, 5, 70], [6, 2, 8, 3, 5]
    cu = cu_seqlens_of(lengths)
    x = torch.randn(int(cu[-1]), CONV_DIM)
    weight = torch.randn(CONV_DIM, WIDTH)
    pool = torch.randn(NUM_SLOTS, CONV_DIM, WIDTH - 1)
    before = pool.clone()

    out = backend.conv_prefill(x, weight, cu, pool, torch.tensor(slots))

    for i, slot in enumerate(slots):
        seq = torch.cat([before[slot], x[cu[i] : cu[i + 1]].T], dim=1)  # [C, W-1+L]
        ref = causal_conv1d_fn(seq[None], weight, activation="silu")[0, :, WIDTH - 1 :].T
        assert rel_err(out[cu[i] : cu[i + 1]], ref) <= FP32_TOL
        # Exact: the state is a copy of the newest W-1 inputs (old history shifted in for short requests).
        assert torch.equal(pool[slot], seq[:, -(WIDTH - 1) :])
    untouched = [s for s in range(NUM_SLOTS) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def test_conv_decode(backend) -> None:
    slots = torch.tensor([7, 1, 4])
    x = torch.randn(len(slots), CONV_DIM)
    weight = torch.randn(CONV_DIM, WIDTH)
    pool = torch.randn(NUM_SLOTS, CONV_DIM, WIDTH - 1)
    before = pool.clone()

    out = backend.conv_decode(x, weight, pool, slots)

    ref_state = before[slots].clone()
    ref = causal_conv1d_update(x[:, :, None], ref_state, weight, activation="silu")[:, :, 0]
    assert rel_err(out, ref) <= FP32_TOL
    assert torch.equal(pool[slots], ref_state)
    untouched = [s for s in range(NUM_SLOTS) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_conv_decode_steps_equal_prefill(backend) -> None:
    x = torch.randn(6, CONV_DIM)
    weight = torch.randn(CONV_DIM, WIDTH)
    pool = torch.randn(NUM_SLOTS, CONV_DIM, WIDTH - 1)
    pool_steps = pool.clone()
    slot = torch.tensor([3])
    out = backend.conv_prefill(x, weight, cu_seqlens_of([6]), pool, slot)
    steps = torch.cat([backend.conv_decode(x[t : t + 1], weight, pool_steps, slot) for t in range(6)])
    assert rel_err(steps, out) <= FP32_TOL
    assert torch.allclose(pool_steps, pool)


# ---------------------------------------------------------------- delta rule


@pytest.mark.parametrize("ref_fn", [torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule])
def test_delta_prefill_varlen(backend, ref_fn) -> None:
    lengths, slots = [1, 63, 64, 65, 130], [7, 2, 5, 1, 8]
    cu = cu_seqlens_of(lengths)
    inp = gdn_inputs(int(cu[-1]))
    pool = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    before = pool.clone()

    out = delta_prefill(backend, inp, cu, pool, torch.tensor(slots))[0]

    assert out.shape == (int(cu[-1]), HV, V) and out.dtype == torch.float32
    for i, slot in enumerate(slots):
        ref_out, ref_state = hf_delta(ref_fn, inp, int(cu[i]), int(cu[i + 1]), before[slot])
        assert rel_err(out[cu[i] : cu[i + 1]], ref_out) <= FP32_TOL, f"request {i} (len {lengths[i]})"
        assert rel_err(pool[slot], ref_state) <= FP32_TOL, f"request {i} (len {lengths[i]})"
    untouched = [s for s in range(NUM_SLOTS) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def test_halves_hand_fp32_states_on_past_a_bf16_pool(backend) -> None:
    """A request in two calls (cut at 64 tokens) whose first call hands its final state on computes
    what one call does, though the pool is bf16 and the first call writes nothing to it; through the
    pool the state is rounded between the calls, which moves the second call's outputs."""
    inp = gdn_inputs(130)
    pool = (torch.randn(NUM_SLOTS, HV, K, V) * 0.5).to(torch.bfloat16)
    whole_pool, before = pool.clone(), pool.clone()
    slots = torch.tensor([3])
    whole, _ = delta_prefill(backend, inp, cu_seqlens_of([130]), whole_pool, slots)
    first, handed = delta_prefill(backend, token_rows(inp, slice(0, 64)), cu_seqlens_of([64]), pool, slots,
                                  flow=StateFlow(False, True, (0,)))
    assert handed.dtype == torch.float32 and torch.equal(pool, before)  # nothing written yet
    second, _ = delta_prefill(backend, token_rows(inp, slice(64, 130)), cu_seqlens_of([66]), pool, slots,
                              flow=StateFlow(False, False, (0,)), handed=handed)
    assert rel_err(torch.cat([first, second]), whole) <= FP32_TOL
    assert rel_err(pool[3], whole_pool[3]) <= BF16_TOL  # the same fp32 state, rounded once
    assert torch.equal(pool[[0, 1, 2, 4, 5, 6, 7, 8]], before[[0, 1, 2, 4, 5, 6, 7, 8]])
    # Through the pool, the second call starts from the rounded state.
    rounded, _ = delta_prefill(backend, token_rows(inp, slice(64, 130)), cu_seqlens_of([66]),
                               handed.to(torch.bfloat16), torch.tensor([0]))
    assert rel_err(rounded, second) > 10 * FP32_TOL


def test_a_fresh_call_reads_no_slot_and_the_dummy_slot_is_never_written(backend) -> None:
    lengths = [40, 70]
    cu = cu_seqlens_of(lengths)
    inp = gdn_inputs(110)
    pool = torch.full((NUM_SLOTS, HV, K, V), float("nan"))  # a fresh request must not read its slot
    pool[0] = torch.randn(HV, K, V)
    zeros = torch.zeros(NUM_SLOTS, HV, K, V)
    dummy = pool[0].clone()
    out, _ = delta_prefill(backend, inp, cu, pool, torch.tensor([0, 5]), flow=StateFlow(True, False, (1,)))
    ref, _ = delta_prefill(backend, inp, cu, zeros, torch.tensor([2, 5]))
    assert torch.isfinite(out).all() and rel_err(out, ref) <= FP32_TOL
    assert torch.equal(pool[0], dummy)  # slot 0 (warm-up, padding) keeps its contents
    assert torch.equal(pool[5], zeros[5])
    assert pool[[1, 2, 3, 4, 6, 7, 8]].isnan().all()


def test_delta_decode(backend) -> None:
    slots = torch.tensor([6, 3, 1])
    inp = gdn_inputs(len(slots))
    pool = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    before = pool.clone()

    out = backend.delta_decode(inp, pool, slots)

    for i, slot in enumerate(slots.tolist()):
        ref_out, ref_state = hf_delta(torch_recurrent_gated_delta_rule, inp, i, i + 1, before[slot])
        assert rel_err(out[i], ref_out[0]) <= FP32_TOL
        assert rel_err(pool[slot], ref_state) <= FP32_TOL
    untouched = [s for s in range(NUM_SLOTS) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_delta_decode_steps_equal_prefill(backend) -> None:
    steps, slots = 70, torch.tensor([4, 8])
    inp = gdn_inputs(steps * len(slots))  # token t of request r at row t * B + r (decode batch order)
    pool = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    pool_prefill = pool.clone()

    decoded = torch.stack(
        [
            backend.delta_decode(token_rows(inp, slice(2 * t, 2 * t + 2)), pool, slots)
            for t in range(steps)
        ]
    )  # [steps, B, HV, V]
    # Same tokens regrouped request-major for one varlen prefill.
    request_major = torch.arange(steps * 2).view(steps, 2).T.flatten()
    out = delta_prefill(backend, token_rows(inp, request_major), cu_seqlens_of([steps, steps]), pool_prefill, slots)[0]

    assert rel_err(decoded.transpose(0, 1).flatten(0, 1), out) <= FP32_TOL
    assert rel_err(pool[slots], pool_prefill[slots]) <= FP32_TOL


def test_delta_decode_padding_rows_leave_real_rows_alone(backend) -> None:
    """Padding rows carry slot 0: they may write slot 0 but must not change real rows' results."""
    inp = gdn_inputs(4)
    pool = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    pool_ref = pool.clone()
    out = backend.delta_decode(inp, pool, torch.tensor([2, 0, 5, 0]))
    ref = backend.delta_decode(token_rows(inp, [0, 2]), pool_ref, torch.tensor([2, 5]))
    assert torch.equal(out[[0, 2]], ref)
    assert torch.equal(pool[1:], pool_ref[1:])


# ---------------------------------------------------------------- bf16


def test_bf16_inputs_fp32_state(backend) -> None:
    lengths, slots = [5, 70], torch.tensor([3, 6])
    cu = cu_seqlens_of(lengths)
    inp = gdn_inputs(int(cu[-1]), torch.bfloat16)
    pool = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    pool32 = pool.clone()

    out = delta_prefill(backend, inp, cu, pool, slots)[0]
    inp32 = DeltaInputs(**{n: x.float() if isinstance(x, torch.Tensor) else x for n, x in vars(inp).items()})
    out32 = delta_prefill(backend, inp32, cu, pool32, slots)[0]
    assert out.dtype == torch.bfloat16 and pool.dtype == torch.float32
    assert rel_err(out, out32) <= BF16_TOL
    assert rel_err(pool, pool32) <= FP32_TOL  # state math is fp32 on the same (bf16-exact) inputs

    x = torch.randn(int(cu[-1]), CONV_DIM, dtype=torch.bfloat16)
    weight = torch.randn(CONV_DIM, WIDTH, dtype=torch.bfloat16)
    conv = torch.randn(NUM_SLOTS, CONV_DIM, WIDTH - 1, dtype=torch.bfloat16)
    conv32 = conv.float()
    y = backend.conv_prefill(x, weight, cu, conv, slots)
    y32 = backend.conv_prefill(x.float(), weight.float(), cu, conv32, slots)
    assert y.dtype == torch.bfloat16 and rel_err(y, y32) <= BF16_TOL
    assert torch.equal(conv.float(), conv32)  # the state holds raw inputs, exact in bf16


def test_bf16_state_pool(backend) -> None:
    """A bf16 pool rounds the state after each call; prefill + decode stay near the fp32-pool result."""
    lengths, slots = [40, 90], torch.tensor([2, 7])
    cu = cu_seqlens_of(lengths)
    inp = gdn_inputs(int(cu[-1]) + 2 * 8)
    pool32 = torch.randn(NUM_SLOTS, HV, K, V) * 0.5
    pool16 = pool32.to(torch.bfloat16)
    pool32 = pool16.float()  # same starting values

    total = int(cu[-1])
    outs = {}
    for name, pool in (("fp32", pool32), ("bf16", pool16)):
        res = [delta_prefill(backend, token_rows(inp, slice(0, total)), cu, pool, slots)[0]]
        for t in range(total, total + 16, 2):
            res.append(backend.delta_decode(token_rows(inp, slice(t, t + 2)), pool, slots))
        outs[name] = torch.cat(res)
    assert pool16.dtype == torch.bfloat16
    assert rel_err(outs["bf16"], outs["fp32"]) <= BF16_STATE_TOL
    assert rel_err(pool16, pool32) <= BF16_STATE_TOL
