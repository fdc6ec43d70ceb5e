"""One recurrent gated-delta step per request, in place on the pooled SSM state (fp32, or bf16 with
--mamba-ssm-dtype bfloat16: half the bytes a step moves, the math still fp32, the state rounded once
a step as the torch reference rounds it).

A program owns the [K, BLOCK_V] column block `vb` of value head `hv` of one request and does all
of it in one pass over the state: gates, L2 norms, decay, delta update, output, write-back.
The grid is (V / BLOCK_V, HV, B) with the value block fastest, so consecutive programs sweep one
request's [HV, K, V] state front to back and the state is read once and written once, straight
from its pool slot: no gather/scatter copies.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

L2NORM_EPS = 1e-6
STATE_DTYPES = (torch.float32, torch.bfloat16)  # the pool's, engine/args.py SSM_DTYPES


@triton.jit
def _gated_delta_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slot_ptr, out_ptr,
    stride_q, stride_k, stride_v, stride_a, stride_b, stride_out, stride_slot, scale, eps,
    GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BLOCK_V: tl.constexpr,
):
    vb = tl.program_id(0)
    hv = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    hk = hv // GROUP  # value head hv reads key head hv // (HV / H)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    live = slot != 0  # padding rows move no state bytes and output zeros
    ok = tl.arange(0, K)
    ov = vb * BLOCK_V + tl.arange(0, BLOCK_V)

    state = state_ptr + slot * stride_slot + hv * (K * V) + ok[:, None] * V + ov[None, :]
    # Issue the big load first so the small ones and the gate math overlap with it.
    s = tl.load(state, mask=live, other=0.0).to(tl.float32)

    q = tl.load(q_ptr + row * stride_q + hk * K + ok).to(tl.float32)
    k = tl.load(k_ptr + row * stride_k + hk * K + ok).to(tl.float32)
    v = tl.load(v_ptr + row * stride_v + hv * V + ov).to(tl.float32)
    x = tl.load(a_ptr + row * stride_a + hv).to(tl.float32) + tl.load(dt_bias_ptr + hv).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's threshold
    decay = tl.exp(-tl.exp(tl.load(A_log_ptr + hv).to(tl.float32)) * softplus)
    beta = tl.sigmoid(tl.load(b_ptr + row * stride_b + hv).to(tl.float32))
    q = q * (tl.rsqrt(tl.sum(q * q, axis=0) + eps) * scale)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)

    s = s * decay
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * u[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(state, s.to(state_ptr.dtype.element_ty), mask=live)
    o = tl.where(live, o, 0.0)
    tl.store(out_ptr + row * stride_out + hv * V + ov, o.to(out_ptr.dtype.element_ty))


def _rows_contiguous(x: torch.Tensor, name: str) -> None:
    """Per-token rows may be strided (views into the fused qkv), but heads and dims must be packed."""
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        raise ValueError(f"{name} needs packed [heads, dim] rows, got strides {x.stride()}")


def gated_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    out: torch.Tensor | None = None,
    block_v: int = 64,  # fastest on the H200 at 122B shapes (benchmarks/bench_gdn_attention.py --sweep)
    num_warps: int = 4,
) -> torch.Tensor:
    """q, k [B, H, K], v [B, HV, V], a, b [B, HV], A_log, dt_bias [HV], ssm_state [S, HV, K, V] fp32 or
    bf16, slots [B] -> o [B, HV, V] in v's dtype; ssm_state[slots] advances one token in place."""
    batch, heads, dk = q.shape
    v_heads, dv = v.shape[1], v.shape[2]
    if ssm_state.dtype not in STATE_DTYPES or not ssm_state[0].is_contiguous():
        raise ValueError(f"the SSM state pool must be fp32 or bf16 with packed [HV, K, V] slots, got "
                         f"{ssm_state.dtype} with strides {ssm_state.stride()}")
    if ssm_state.shape[1:] != (v_heads, dk, dv) or v_heads % heads:
        raise ValueError(f"state {tuple(ssm_state.shape)} does not fit q {tuple(q.shape)}, v {tuple(v.shape)}")
    if dk & (dk - 1) or dv & (dv - 1):
        raise ValueError(f"head dims must be powers of two, got K={dk}, V={dv}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _rows_contiguous(t, name)
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("a and b need a contiguous head dimension")
    block_v = min(block_v, dv)
    if out is None:
        out = torch.empty(batch, v_heads, dv, dtype=v.dtype, device=v.device)
    grid = (dv // block_v, v_heads, batch)
    _gated_delta_decode_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, ssm_state, slots, out,
        q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), out.stride(0), ssm_state.stride(0),
        dk**-0.5, L2NORM_EPS,
        GROUP=v_heads // heads, K=dk, V=dv, BLOCK_V=block_v, num_warps=num_warps,
    )
    return out
