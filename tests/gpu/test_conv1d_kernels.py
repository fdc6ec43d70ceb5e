"""Triton conv1d update and varlen prefill against TorchGDNBackend on random inputs and states."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_checks import DEVICE, TOL, assert_close, others, poisoned, random_slots

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.torch_backend import TorchGDNBackend
from minisgl.kernels.conv1d import conv1d_prefill, conv1d_update
from minisgl.kernels.planar_out import PlanarOut

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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels,qk", [(48, (32, 8)), (12288, (4096, 128))], ids=["tiny", "122b"])
def test_conv1d_prefill_normalises_q_and_k_heads(channels: int, qk: tuple[int, int], dtype: torch.dtype) -> None:
    """With qk_norm (the fla backend's prefill), each head of the first channels comes out
    L2-normalised from the rounded conv outputs; the rest are the plain conv's outputs."""
    weight, state = make(channels, 4, dtype)
    lengths = [1, 70, 5, 130]
    slots = random_slots(len(lengths), NUM_SLOTS)
    cu = F.pad(torch.tensor(lengths, device=DEVICE).cumsum(0), (1, 0)).to(torch.int32)
    x = torch.randn(sum(lengths), channels, dtype=dtype, device=DEVICE)
    plain = TorchGDNBackend().conv_prefill(x, weight, cu, state.clone(), slots)
    ref = TorchGDNBackend().conv_prefill(x, weight, cu, state.clone(), slots, qk_norm=qk)
    out = conv1d_prefill(x, weight, cu, state, slots, max_len=max(lengths), qk_norm=qk)
    assert_close(out, ref, TOL[dtype], "normalised conv prefill output")
    normed, head = qk
    norms = out[:, :normed].float().unflatten(1, (-1, head)).norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=4 * TOL[dtype]), "q and k heads are unit vectors"
    assert_close(out[:, normed:], plain[:, normed:], TOL[dtype], "v channels untouched")
    with pytest.raises(ValueError, match="qk_norm"):
        conv1d_prefill(x, weight, cu, state, slots, qk_norm=(normed, 3 * head))


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


@pytest.mark.parametrize("mapped", [False, True], ids=["step-order", "calls-order"])
@pytest.mark.parametrize("bounds", [(16, 32), (2048, 4096), (0, 40)], ids=["tiny", "122b-qkv", "empty-blocks"])
def test_mixed_step_into_planar_blocks(bounds: tuple[int, int], mapped: bool) -> None:
    """A mixed step's conv as the GDN mixer runs it: 3 decode rows (one padding) through the update
    kernel, then 3 prefill requests from row 3, into one PlanarOut; each column block must hold the
    reference's columns, contiguous, every row written. `mapped`: two lone prompts run as halves
    (prefill_groups.py), and the prefill rows go where the batch's call_order puts them."""
    channels = 40 if bounds[1] <= 40 else CHANNELS[1]
    weight, state = make(channels, 4, torch.bfloat16)
    dec_slots = torch.tensor([3, 0, 7], device=DEVICE)
    pre_slots = torch.tensor([5, 9, 1], device=DEVICE)
    lengths = [1100, 1300, 7] if mapped else [4, 70, 1]
    cu = F.pad(torch.tensor(lengths, device=DEVICE).cumsum(0), (1, 0)).to(torch.int32)
    xd = torch.randn(3, channels, dtype=torch.bfloat16, device=DEVICE)
    xp = torch.randn(sum(lengths), channels, dtype=torch.bfloat16, device=DEVICE)

    ref_state = state.clone()
    ref = torch.cat([TorchGDNBackend().conv_decode(xd, weight, ref_state, dec_slots),
                     TorchGDNBackend().conv_prefill(xp, weight, cu, ref_state, pre_slots)])
    row_map = None
    if mapped:  # under a bound of 1024 tokens the first two pair up as [512 | 640], [588 | 660]
        table = torch.zeros(NUM_SLOTS, 64, dtype=torch.int64)
        batch = ForwardBatch.build([[1] * n for n in lengths], [0] * 3, pre_slots.tolist(), table, 64, "cpu",
                                   gdn_group_tokens=1024)
        assert [g.extend_lens for g in batch.groups] == [(512, 640), (588, 660), (7,)]
        row_map = batch.call_order.rows.to(DEVICE)
        ref = torch.cat([ref[:3], ref[3:][batch.call_order.sources.to(DEVICE)]])
    out = PlanarOut.empty(ref.shape[0], channels, bounds, torch.bfloat16, DEVICE)
    out.flat.copy_(poisoned(out.flat.numel(), dtype=torch.bfloat16))
    conv1d_update(xd, weight, state, dec_slots, out=out)
    conv1d_prefill(xp, weight, cu, state, pre_slots, out=out.from_row(3), max_len=max(lengths), row_map=row_map)

    b1, b2 = bounds
    for part, (s, e) in zip(out.parts(), ((0, b1), (b1, b2), (b2, channels))):
        assert part.is_contiguous() and part.shape == (ref.shape[0], e - s)
        if e == s:
            continue
        live = torch.ones(ref.shape[0], dtype=torch.bool, device=DEVICE)
        live[1] = False  # the padding decode row outputs zeros
        assert_close(part[live], ref[live, s:e], TOL[torch.bfloat16], f"columns {s}:{e}")
        assert (part[1] == 0).all()
    # Slot 0 aside: the reference computes the padding row on it (scratch), the kernel leaves it.
    assert torch.equal(state[1:], ref_state[1:]), "the windows of every slot are copies of inputs: exact"
