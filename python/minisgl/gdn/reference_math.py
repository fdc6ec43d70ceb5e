"""Pure fp32 math of the gated delta rule, shared by the torch backend and the tests of faster kernels.

Recurrence per value head, with S the [K, V] state:
    S <- exp(g) * S;  u = beta * (v - S^T k);  S <- S + k u^T;  o = S^T q
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

L2NORM_EPS = 1e-6


def l2norm(x: Tensor, eps: float = L2NORM_EPS) -> Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim (eps inside the sqrt, as the checkpoint was trained)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """Raw projections a, b [..., HV] -> (log-decay g <= 0, write strength beta in (0, 1)), both fp32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def prepare_qk(q: Tensor, k: Tensor, num_v_heads: int, normed: bool = False) -> tuple[Tensor, Tensor]:
    """q, k [..., H, K] -> fp32 [..., HV, K]: L2-normalised (unless `normed`: the conv did it), q scaled
    by K^-0.5, and each key head repeated for its HV // H consecutive value heads (value head j reads
    key head j // (HV // H))."""
    group = num_v_heads // q.shape[-2]
    q, k = (q.float(), k.float()) if normed else (l2norm(q.float()), l2norm(k.float()))
    q = q * q.shape[-1] ** -0.5
    return q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)


def gated_delta_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token for any leading dims: q, k [..., K], v [..., V], g, beta [...], state [..., K, V] (fp32).
    Returns (o [..., V], new state); `state` itself is not modified."""
    state = state * g.exp()[..., None, None]
    u = beta[..., None] * (v - torch.einsum("...kv,...k->...v", state, k))
    state = state + k[..., :, None] * u[..., None, :]
    return torch.einsum("...kv,...k->...v", state, q), state


def chunk_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int = 64
) -> tuple[Tensor, Tensor]:
    """One sequence, all heads at once: q, k [L, HV, K], v [L, HV, V], g, beta [L, HV], state [HV, K, V],
    all fp32 with q, k already prepared. Returns (o [L, HV, V], final state).

    Inside a chunk, with c_t the cumulative log-decay from the chunk start and S0 the entry state,
        S_t = e^{c_t} S0 + sum_{s<=t} e^{c_t - c_s} k_s u_s^T,
    so the corrections u solve the unit lower-triangular system
        u_t + beta_t sum_{s<t} e^{c_t - c_s} (k_t.k_s) u_s = beta_t (v_t - e^{c_t} S0^T k_t),
    i.e. U = Uv - W S0 with Uv, W from one triangular solve that does not depend on S0. Only the cheap
    S0-dependent part runs sequentially over chunks.
    """
    length, heads, _ = k.shape
    # Zero-padding to whole chunks is inert: beta = k = 0 gives u = 0, and g = 0 adds no decay.
    pad = -length % chunk
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (length + pad) // chunk
    # Head-major chunked layout: [HV, n, chunk, ...].
    q, k, v = (x.transpose(0, 1).reshape(heads, n, chunk, -1) for x in (q, k, v))
    g, beta = (x.transpose(0, 1).reshape(heads, n, chunk) for x in (g, beta))

    c = g.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # decay[t, s] = e^{c_t - c_s} for s <= t; masked before exp so s > t cannot overflow.
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(~causal, float("-inf")).exp()

    system = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    rhs = torch.cat([beta[..., None] * v, (beta * c.exp())[..., None] * k], dim=-1)
    # unitriangular=True takes the diagonal as 1, which supplies the identity in (I + system).
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    uv, w = solved.split([v.shape[-1], k.shape[-1]], dim=-1)

    attn = (q @ k.transpose(-1, -2)) * decay
    q_in = q * c.exp()[..., None]  # reads the entry state, decayed to position t
    k_out = k * (c[..., -1:] - c).exp()[..., None]  # writes, decayed to the chunk end
    chunk_decay = c[..., -1].exp()[..., None, None]

    o = torch.empty_like(v)
    for i in range(n):
        u = uv[:, i] - w[:, i] @ state
        o[:, i] = q_in[:, i] @ state + attn[:, i] @ u
        state = chunk_decay[:, i] * state + k_out[:, i].transpose(-1, -2) @ u
    return o.reshape(heads, n * chunk, -1)[:, :length].transpose(0, 1), state
