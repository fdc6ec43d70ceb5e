"""Triton in-place gated-delta decode against TorchGDNBackend.delta_decode, tiny and 122B shapes."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICE, TOL, assert_close, others, poisoned, random_slots

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.torch_backend import TorchGDNBackend
from minisgl.kernels.gated_delta_decode import gated_delta_decode

pytestmark = pytest.mark.gpu

NUM_SLOTS = 12
# (H, HV, K, V): the tiny test model's, and Qwen3.5-122B's GDN heads.
SHAPES = [(2, 4, 32, 32), (16, 64, 128, 128)]


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def decode_inputs(batch: int, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype) -> DeltaInputs:
    """q, k, v as strided views of one fused row, exactly as the mixer slices its conv output."""
    qkv = torch.randn(batch, 2 * h * dk + hv * dv, dtype=dtype, device=DEVICE)
    return DeltaInputs(
        q=qkv[:, : h * dk].view(batch, h, dk),
        k=qkv[:, h * dk : 2 * h * dk].view(batch, h, dk),
        v=qkv[:, 2 * h * dk :].view(batch, hv, dv),
        a=torch.randn(batch, hv, dtype=dtype, device=DEVICE),
        b=torch.randn(batch, hv, dtype=dtype, device=DEVICE),
        A_log=torch.linspace(0.01, 1.5, hv, device=DEVICE).log(),
        dt_bias=torch.randn(hv, device=DEVICE),
    )


def kernel_inputs(inp: DeltaInputs) -> tuple[torch.Tensor, ...]:
    """The kernel's tensors, in its order (the decode conv never normalises q and k beforehand)."""
    assert not inp.qk_normed
    return inp.q, inp.k, inp.v, inp.a, inp.b, inp.A_log, inp.dt_bias


# A bf16 pool's state is rounded once a step, by both: fp32 sums in another order flip a rounding now
# and then, by one bf16 step (at most 2^-7 of the element), so nearly every element must match exactly
# (a kernel that truncated instead of rounding would differ in about half of them).
STATE_TOL = {torch.float32: 1e-3, torch.bfloat16: 2**-7}
BF16_STATE_EXACT = 0.99


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32_state", "bf16_state"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_delta_decode(shape: tuple[int, int, int, int], dtype: torch.dtype, state_dtype: torch.dtype) -> None:
    h, hv, dk, dv = shape
    real = random_slots(6, NUM_SLOTS)
    zero = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    slots = torch.cat([real[:3], zero, real[3:]])
    inp = decode_inputs(slots.shape[0], h, hv, dk, dv, dtype)
    state = (torch.randn(NUM_SLOTS + 1, hv, dk, dv, device=DEVICE) * 0.5).to(state_dtype)

    ref_state = state.clone()
    ref = TorchGDNBackend().delta_decode(inp, ref_state, slots)
    ours_state = state.clone()
    out = poisoned(slots.shape[0], hv, dv, dtype=dtype)
    gated_delta_decode(*kernel_inputs(inp), ssm_state=ours_state, slots=slots, out=out)

    live = slots != 0
    assert_close(out[live], ref[live], TOL[dtype], "decode output")
    assert (out[~live] == 0).all(), "padding rows must output zeros"
    assert ours_state.dtype == state_dtype
    assert_close(ours_state[real], ref_state[real], STATE_TOL[state_dtype], "updated state")
    if state_dtype == torch.bfloat16:
        exact = (ours_state[real] == ref_state[real]).float().mean().item()
        assert exact >= BF16_STATE_EXACT, f"only {exact:.4f} of the bf16 state elements equal the reference's"
    untouched = others(real, NUM_SLOTS + 1)
    assert torch.equal(ours_state[untouched], state[untouched]), "slots outside the batch (and slot 0) changed"


@pytest.mark.parametrize("block_v,num_warps", [(16, 2), (64, 4), (128, 8)])
def test_gated_delta_decode_tilings(block_v: int, num_warps: int) -> None:
    """Every tiling the benchmark sweeps computes the same function."""
    h, hv, dk, dv = SHAPES[1]
    slots = random_slots(4, NUM_SLOTS)
    inp = decode_inputs(4, h, hv, dk, dv, torch.float32)
    state = torch.randn(NUM_SLOTS + 1, hv, dk, dv, device=DEVICE)
    ref_state = state.clone()
    ref = TorchGDNBackend().delta_decode(inp, ref_state, slots)
    out = gated_delta_decode(*kernel_inputs(inp), ssm_state=state, slots=slots, block_v=block_v, num_warps=num_warps)
    assert_close(out, ref, 1e-3, "decode output")
    assert_close(state[slots], ref_state[slots], 1e-3, "updated state")
