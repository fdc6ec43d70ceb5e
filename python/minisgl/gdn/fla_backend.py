"""GDN backend "fla": our Triton conv and decode kernels, with prefill's gated delta rule on
flash-linear-attention's varlen `chunk_gated_delta_rule` (importing this module needs fla).

Prefill gathers the requests' initial states from their slots, runs all requests in one varlen call,
and scatters the final states back; prefill is compute-bound, so the copies cost little there,
unlike decode, which updates the pool in place (kernels/gated_delta_decode.py).
"""
from __future__ import annotations

from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from torch import Tensor

from minisgl.gdn.reference_math import gdn_gates
from minisgl.gdn.triton_backend import TritonGDNBackend


class FlaGDNBackend(TritonGDNBackend):
    def delta_prefill(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        b: Tensor,
        A_log: Tensor,
        dt_bias: Tensor,
        cu_seqlens: Tensor,
        ssm_state: Tensor,
        slots: Tensor,
    ) -> Tensor:
        """q, k [T, H, K], v [T, HV, V], a, b [T, HV] varlen over cu_seqlens -> o [T, HV, V]."""
        g, beta = gdn_gates(a, b, A_log, dt_bias)  # fp32, exactly the reference's gates
        initial = ssm_state[slots]
        o, final = chunk_gated_delta_rule(
            q[None], k[None], v[None], g[None], beta[None],
            scale=q.shape[-1] ** -0.5,
            initial_state=initial,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_seqlens.long(),
        )
        # Padding rows (slot 0) write back the state they read, so slot 0 keeps its contents.
        live = (slots != 0)[:, None, None, None]
        ssm_state[slots] = final.where(live, initial).to(ssm_state.dtype)
        return o[0]
