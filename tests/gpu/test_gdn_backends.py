"""The registered GDN backends ("triton", "fla") against "torch": a varlen prefill from random
initial states, then decode steps, at tiny and 122B shapes, through the backend interface."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from kernel_checks import DEVICE, assert_close, others, random_slots

pytest.importorskip("triton")  # CPU-only installs collect these files and skip them

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.prefill_states import delta_prefill
from minisgl.gdn.registry import GDN_BACKENDS

pytestmark = pytest.mark.gpu

NUM_SLOTS = 10
WIDTH = 4
SHAPES = [(2, 4, 32, 32), (16, 64, 128, 128)]  # (H, HV, K, V)
BACKENDS = [
    "triton",
    pytest.param("fla", marks=pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla not installed")),
]
# fla's chunked kernel runs its products on tensor cores (tf32 for fp32 inputs), so its prefill gets
# a looser bound than our fp32 kernels; bf16 outputs carry bf16 rounding either way.
TOL = {("triton", torch.float32): 1e-3, ("fla", torch.float32): 5e-3}
BF16_TOL = 2e-2


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def tokens(n: int, h: int, hv: int, dk: int, dv: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    qkv = torch.randn(n, 2 * h * dk + hv * dv, dtype=dtype, device=DEVICE)
    return dict(
        qkv=qkv,
        a=torch.randn(n, hv, dtype=dtype, device=DEVICE),
        b=torch.randn(n, hv, dtype=dtype, device=DEVICE),
    )


def mixer_step(backend, inp, params, conv_state, ssm_state, slots, cu, shape):
    """What the GDN mixer does with a backend, minus the projections and the norm."""
    h, hv, dk, dv = shape
    n = inp["qkv"].shape[0]
    if cu is None:
        x = backend.conv_decode(inp["qkv"], params["weight"], conv_state, slots)
    else:
        x = backend.conv_prefill(inp["qkv"], params["weight"], cu, conv_state, slots)
    q = x[:, : h * dk].view(n, h, dk)
    k = x[:, h * dk : 2 * h * dk].view(n, h, dk)
    v = x[:, 2 * h * dk :].view(n, hv, dv)
    delta = DeltaInputs(q, k, v, inp["a"], inp["b"], params["A_log"], params["dt_bias"])
    if cu is None:
        return backend.delta_decode(delta, ssm_state, slots)
    return delta_prefill(backend, delta, cu, ssm_state, slots)[0]


# (activations, SSM pool): fp32 throughout, and the served bf16 model with either pool (--mamba-ssm-dtype).
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16)]


@pytest.mark.parametrize("dtype,state_dtype", DTYPES, ids=["fp32", "bf16", "bf16_state"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_matches_torch(name: str, shape: tuple[int, int, int, int], dtype: torch.dtype,
                               state_dtype: torch.dtype) -> None:
    h, hv, dk, dv = shape
    channels = 2 * h * dk + hv * dv
    params = dict(
        weight=torch.randn(channels, WIDTH, dtype=dtype, device=DEVICE) * 0.5,
        A_log=torch.linspace(0.01, 1.5, hv, device=DEVICE).log(),
        dt_bias=torch.randn(hv, device=DEVICE),
    )
    conv0 = torch.randn(NUM_SLOTS + 1, channels, WIDTH - 1, dtype=dtype, device=DEVICE)
    ssm0 = (torch.randn(NUM_SLOTS + 1, hv, dk, dv, device=DEVICE) * 0.3).to(state_dtype)
    lengths = [1, 3, 100, 65]
    slots = random_slots(len(lengths), NUM_SLOTS)
    cu = F.pad(torch.tensor(lengths, device=DEVICE).cumsum(0), (1, 0)).to(torch.int32)
    tol = TOL.get((name, dtype), BF16_TOL) if state_dtype == torch.float32 else BF16_TOL

    states = {}
    for which in ("torch", name):
        backend = GDN_BACKENDS.get(which)()
        conv, ssm = conv0.clone(), ssm0.clone()
        torch.manual_seed(1)  # the same inputs for both backends
        outs = [mixer_step(backend, tokens(sum(lengths), *shape, dtype), params, conv, ssm, slots, cu, shape)]
        for _ in range(3):
            outs.append(mixer_step(backend, tokens(len(lengths), *shape, dtype), params, conv, ssm, slots, None, shape))
        states[which] = (outs, conv, ssm)

    (ref_outs, ref_conv, ref_ssm), (outs, conv, ssm) = states["torch"], states[name]
    for step, (o, r) in enumerate(zip(outs, ref_outs)):
        assert_close(o, r, tol, f"{name} step {step} output")
    assert ssm.dtype == state_dtype
    assert_close(ssm[slots], ref_ssm[slots], tol, f"{name} final SSM state")
    assert torch.equal(conv[slots], ref_conv[slots]), "conv windows are copies of inputs: exact"
    untouched = others(slots, NUM_SLOTS + 1)
    assert torch.equal(ssm[untouched], ssm0[untouched]) and torch.equal(conv[untouched], conv0[untouched])
