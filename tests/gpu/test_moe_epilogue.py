"""The MoE combine with the gated shared expert fused in (moe_combine's `shared`, TritonExperts'
`shared=SharedAddend`) against the torch ops MoE blocks ran before: the routed sum rounded to x's
dtype, then SharedAddend.add_to (sigmoid in the logit's dtype, the product rounded, the sum rounded);
and with the decoder layer's residual add fused in too (`residual=`), against `residual + output`.

Tolerance: none. The kernel computes each op exactly in fp32 and rounds where torch rounds, and
gets the sigmoid from torch itself, so the output must be bit for bit torch's (torch.equal), in
torch's promoted dtype. Fresh random rows, ids of -1 and of another rank's experts, a token with no
valid pair; bf16 and fp32; tiny shapes and the 122B's H = 3072, k = 8.

bf16 runs on the GPU only: triton 3.6's interpreter truncates fp32 -> bf16 casts instead of
rounding them to nearest. On the CPU:
    MINISGL_TESTS=$PWD/tests TRITON_INTERPRET=1 PYTHONPATH=/tmp/shim:python:tests \\
        python -m pytest -q --noconftest --import-mode=append tests/gpu/test_moe_epilogue.py
"""
from __future__ import annotations

import pytest
import torch

from kernel_checks import DEVICE, captured

pytest.importorskip("triton")  # CPU-only installs collect this file and skip it

from minisgl.kernels import moe_gemm
from minisgl.moe.shared_addend import SharedAddend
from minisgl.moe.triton_experts import TritonExperts

pytestmark = pytest.mark.gpu

F32, BF16 = torch.float32, torch.bfloat16
# (x's dtype, the gate logit's dtype): the model's bf16 and the fp32 test models, and an fp32 gate
# over bf16 activations (torch promotes the product and the sum to fp32).
DTYPES = [(F32, F32), (BF16, BF16), (BF16, F32)]
# (T, E_local, k, H): a tiny odd width, decode's single token, the 122B at decode and prefill sizes.
SHAPES = [(6, 16, 8, 40), (1, 256, 8, 3072), (64, 256, 8, 3072), (300, 128, 8, 3072)]


def _needs_rounding(dtype: torch.dtype) -> None:
    if DEVICE == "cpu" and dtype != F32:
        pytest.skip("the interpreter truncates fp32 -> bf16 casts (GPU only)")


def _ids(t: int, e: int, k: int) -> torch.Tensor:
    ids = torch.randint(-1, e + 2, (t, k), device=DEVICE)  # -1 padding, >= e another rank's experts
    if t > 2:
        ids[t // 2] = -1  # a token with no valid pair: out = its gated shared row
    return ids


def _routed_reference(y: torch.Tensor, ids: torch.Tensor, e: int) -> torch.Tensor:
    """The combine's sum in fp32 in its order (pair 0 first), rounded to y's dtype."""
    t, k = ids.shape
    acc = torch.zeros(t, y.shape[1], device=DEVICE)
    for j in range(k):
        ok = (ids[:, j] >= 0) & (ids[:, j] < e)
        acc += torch.where(ok[:, None], y.view(t, k, -1)[:, j].float(), 0.0)
    return acc.to(y.dtype)


@pytest.mark.parametrize("dtype,logit_dtype", DTYPES)
@pytest.mark.parametrize("t,e,k,h", SHAPES)
def test_fused_combine_is_torchs_chain(t: int, e: int, k: int, h: int, dtype: torch.dtype,
                                       logit_dtype: torch.dtype) -> None:
    _needs_rounding(dtype)
    torch.manual_seed(t + e + h)
    y = torch.randn(t * k, h, device=DEVICE).to(dtype)
    ids = _ids(t, e, k)
    logit = (torch.randn(t, 1, device=DEVICE) * 3).to(logit_dtype)  # sigmoid across (0, 1), not just near 1/2
    addend = SharedAddend(torch.randn(t, h, device=DEVICE).to(dtype), logit)
    routed = _routed_reference(y, ids, e)
    ref = addend.add_to(routed)

    out = moe_gemm.moe_combine(y, ids, e, dtype, addend.out, addend.scale())
    assert out.dtype == ref.dtype and out.shape == ref.shape, f"{out.dtype}{tuple(out.shape)}"
    diff = (out.float() - ref.float()).abs()
    assert torch.equal(out, ref), f"{(diff > 0).sum().item()} of {out.numel()} elements differ, max {diff.max():.2e}"
    assert torch.equal(moe_gemm.moe_combine(y, ids, e, dtype), routed), "the unfused combine changed"
    if dtype == BF16 == logit_dtype:  # the test tells the chain from rounding once at the end
        once = (routed.float() + addend.scale().float() * addend.out.float()).to(dtype)
        assert not torch.equal(once, ref)


@pytest.mark.parametrize("residual_dtype", [F32, BF16])
@pytest.mark.parametrize("dtype,logit_dtype", DTYPES)
@pytest.mark.parametrize("with_shared", [True, False], ids=["shared", "routed only"])
@pytest.mark.parametrize("t,e,k,h", SHAPES)
def test_residual_joins_as_torch_adds_it(t: int, e: int, k: int, h: int, with_shared: bool, dtype: torch.dtype,
                                         logit_dtype: torch.dtype, residual_dtype: torch.dtype) -> None:
    """`residual=`: torch's `residual + block_output` on the block's output as moe_combine returns
    it without one (rounded to its dtype first), in their promoted dtype, bit for bit."""
    _needs_rounding(dtype)
    _needs_rounding(residual_dtype)
    torch.manual_seed(t + e + h + with_shared)
    y = torch.randn(t * k, h, device=DEVICE).to(dtype)
    ids = _ids(t, e, k)
    shared = (torch.randn(t, h, device=DEVICE).to(dtype),
              torch.sigmoid((torch.randn(t, 1, device=DEVICE) * 3).to(logit_dtype))) if with_shared else ()
    residual = (torch.randn(t, h, device=DEVICE) * 4).to(residual_dtype)
    ref = residual + moe_gemm.moe_combine(y, ids, e, dtype, *shared)
    out = moe_gemm.moe_combine(y, ids, e, dtype, *shared, residual=residual)
    assert out.dtype == ref.dtype and out.shape == ref.shape, f"{out.dtype}{tuple(out.shape)}"
    diff = (out.float() - ref.float()).abs()
    assert torch.equal(out, ref), f"{(diff > 0).sum().item()} of {out.numel()} elements differ, max {diff.max():.2e}"
    if dtype == BF16 == residual_dtype and not with_shared and t * h >= 3072:
        # the test tells the block's output rounded before the add from one rounding at the end
        exact = _routed_reference(y.float(), ids, e)
        assert not torch.equal((residual.float() + exact).to(dtype), ref)
    with pytest.raises(ValueError, match="residual"):
        moe_gemm.moe_combine(y, ids, e, dtype, *shared, residual=residual[:, :-1])


@pytest.mark.parametrize("t", [0, 1, 37])
def test_backend_adds_the_shared_expert_as_torch_does(t: int) -> None:
    """TritonExperts with a SharedAddend = its routed output, then SharedAddend.add_to."""
    dtype = BF16 if DEVICE == "cuda" else F32
    torch.manual_seed(t)
    e, k, h, i = 8, 4, 192, 96
    x = torch.randn(t, h, device=DEVICE).to(dtype)
    gate_up = (torch.randn(e, 2 * i, h, device=DEVICE) / h**0.5).to(dtype)
    down = (torch.randn(e, h, i, device=DEVICE) / i**0.5).to(dtype)
    ids = _ids(t, e, k)
    weights = torch.rand(t, k, device=DEVICE).softmax(-1).to(dtype)
    addend = SharedAddend(torch.randn(t, h, device=DEVICE).to(dtype), torch.randn(t, 1, device=DEVICE).to(dtype))
    experts = TritonExperts()
    out = experts.forward(x, gate_up, down, ids, weights, shared=addend)
    assert torch.equal(out, addend.add_to(experts.forward(x, gate_up, down, ids, weights)))
    residual = torch.randn(t, h, device=DEVICE).to(dtype)
    assert torch.equal(experts.forward(x, gate_up, down, ids, weights, shared=addend, residual=residual),
                       residual + out)


def test_fused_combine_replays_in_a_graph_and_compiles_once() -> None:
    """Decode captures the combine: new rows, routing and shared output replayed through the same
    buffers match eager, and new token counts add no kernel variant (T is only the grid)."""
    if DEVICE != "cuda":
        pytest.skip("CUDA graphs and compiled variants need a GPU")
    torch.manual_seed(11)
    e, k, h = 256, 8, 3072

    def inputs(t: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(t * k, h, device=DEVICE).to(BF16), _ids(t, e, k),
                torch.randn(t, h, device=DEVICE).to(BF16), torch.sigmoid(torch.randn(t, 1, device=DEVICE).to(BF16)))

    bufs = inputs(48)
    run = lambda: moe_gemm.moe_combine(bufs[0], bufs[1], e, BF16, bufs[2], bufs[3])  # noqa: E731
    graph, out = captured(run)
    for buf, new in zip(bufs, inputs(48)):
        buf.copy_(new)
    graph.replay()
    assert torch.equal(out, run())

    kernel = moe_gemm._moe_combine_kernel
    before = sum(len(cache[0]) for cache in kernel.device_caches.values())
    for t in (1, 3, 100, 1000):
        y, ids, shared, scale = inputs(t)
        moe_gemm.moe_combine(y, ids, e, BF16, shared, scale)
    assert sum(len(cache[0]) for cache in kernel.device_caches.values()) == before, "a token count compiled a variant"
