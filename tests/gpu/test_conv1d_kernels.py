"""Triton conv1d update and varlen prefill against TorchGDNBackend on random inputs and states."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_checks import DEVICE, TOL, assert_close, others, poisoned, random_slots

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.gdn.torch_backend import TorchGDNBackend
from minisgl.kernels.conv1d import conv1d_prefill, conv1d_update

pytestmark = pytest.mark.gpu

NUM_SLOTS = 12
CHANNELS = [40, 12288]  # tiny, and 122B's conv_dim (2*16*128 + 64*128)
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def make(channels: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    weight = torch.randn(channels, width, dtype=dtype, device=DEVICE)
    state = torch.randn(NUM_SLOTS + 1, channels, width - 1, dtype=dtype, device=DEVICE)
    return weight, state


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("width", [2, 3, 4])
def test_conv1d_update(width: int, channels: int, dtype: torch.dtype) -> None:
    weight, state = make(channels, width, dtype)
    real = random_slots(5, NUM_SLOTS)
    zero = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    slots = torch.cat([real[:2], zero, real[2:], zero])  # padding rows in the middle and at the end
    x = torch.randn(slots.shape[0], channels, dtype=dtype, device=DEVICE)

    ref_state = state.clone()
    ref = TorchGDNBackend().conv_decode(x, weight, ref_state, slots)
    ours_state = state.clone()
    out = conv1d_update(x, weight, ours_state, slots, out=poisoned(*x.shape, dtype=dtype))

    live = slots != 0
    assert_close(out[live], ref[live], TOL[dtype], "conv update output")
    assert (out[~live] == 0).all(), "padding rows must output zeros"
    assert torch.equal(ours_state[real], ref_state[real]), "the shifted window is a copy of inputs: exact"
    untouched = others(real, NUM_SLOTS + 1)
    assert torch.equal(ours_state[untouched], state[untouched]), "slots outside the batch (and slot 0) changed"


@pytest.mark.parametrize("known_max", [False, True], ids=["grid-all-tokens", "grid-max-len"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", CHANNELS)
@pytest.mark.parametrize("width", [2, 3, 4])
def test_conv1d_prefill(width: int, channels: int, dtype: torch.dtype, known_max: bool) -> None:
    weight, state = make(channels, width, dtype)
    lengths = [1, 2, 3, 70, 5, 130]  # shorter than the window, and across token blocks
    slots = random_slots(len(lengths), NUM_SLOTS)
    cu = F.pad(torch.tensor(lengths, device=DEVICE).cumsum(0), (1, 0)).to(torch.int32)
    x = torch.randn(sum(lengths), channels, dtype=dtype, device=DEVICE)

    ref_state = state.clone()
    ref = TorchGDNBackend().conv_prefill(x, weight, cu, ref_state, slots)
    ours_state = state.clone()
    out = conv1d_prefill(x, weight, cu, ours_state, slots, out=poisoned(*x.shape, dtype=dtype),
                         max_len=max(lengths) if known_max else None)

    assert_close(out, ref, TOL[dtype], "conv prefill output")
    assert torch.equal(ours_state[slots], ref_state[slots]), "final windows are copies of inputs: exact"
    untouched = others(slots, NUM_SLOTS + 1)
    assert torch.equal(ours_state[untouched], state[untouched]), "slots outside the batch (and slot 0) changed"


@pytest.mark.parametrize("block_t,block_c,num_warps", [(16, 512, 4), (128, 256, 8)])
def test_conv1d_prefill_tilings(block_t: int, block_c: int, num_warps: int) -> None:
    """Other tilings the benchmark sweeps compute the same function (122B channels, bf16)."""
    weight, state = make(CHANNELS[1], 4, torch.bfloat16)
    lengths = [2, 300, 17]
    slots = random_slots(len(lengths), NUM_SLOTS)
    cu = F.pad(torch.tensor(lengths, device=DEVICE).cumsum(0), (1, 0)).to(torch.int32)
    x = torch.randn(sum(lengths), CHANNELS[1], dtype=torch.bfloat16, device=DEVICE)
    ref_state = state.clone()
    ref = TorchGDNBackend().conv_prefill(x, weight, cu, ref_state, slots)
    out = conv1d_prefill(x, weight, cu, state, slots, block_t=block_t, block_c=block_c, num_warps=num_warps)
    assert_close(out, ref, TOL[torch.bfloat16], "conv prefill output")
    assert torch.equal(state[slots], ref_state[slots])
