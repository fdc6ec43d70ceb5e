"""GDN backend "fla": our Triton conv and decode kernels, with prefill's gated delta rule on
flash-linear-attention's varlen `chunk_gated_delta_rule` (importing this module needs fla).

Prefill gathers the requests' initial states from their slots, runs all requests in one varlen call,
and scatters the final states back; prefill is compute-bound, so the copies cost little there,
unlike decode, which updates the pool in place (kernels/gated_delta_decode.py).
"""
from __future__ import annotations

from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from torch import Tensor

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.triton_backend import TritonGDNBackend
from minisgl.prefill_groups import MAX_GROUPS


class FlaGDNBackend(TritonGDNBackend):
    def __init__(self) -> None:
        super().__init__()
        # (cu_seqlens, its int64 copy) of a step's request groups (prefill_groups.py), newest last.
        self._cu: list[tuple[Tensor, Tensor]] = []

    def _cu_seqlens_i64(self, cu_seqlens: Tensor) -> Tensor:
        """The same int64 tensor for every GDN layer of a step: fla caches its chunk indices per
        tensor object, and building them reads cu_seqlens on the host (a sync per layer otherwise)."""
        for seen, i64 in self._cu:
            if seen is cu_seqlens:
                return i64
        self._cu = [*self._cu[1 - MAX_GROUPS :], (cu_seqlens, cu_seqlens.long())]
        return self._cu[-1][1]

    def delta_prefill(self, inp: DeltaInputs, cu_seqlens: Tensor, ssm_state: Tensor, slots: Tensor) -> Tensor:
        """inp varlen over cu_seqlens -> o [T, HV, V]."""
        g, beta = inp.gates()  # fp32, exactly the reference's gates
        initial = ssm_state[slots]
        o, final = chunk_gated_delta_rule(
            inp.q[None], inp.k[None], inp.v[None], g[None], beta[None],
            scale=inp.q.shape[-1] ** -0.5,
            initial_state=initial,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=self._cu_seqlens_i64(cu_seqlens),
        )
        # Padding rows (slot 0) write back the state they read, so slot 0 keeps its contents.
        live = (slots != 0)[:, None, None, None]
        ssm_state[slots] = final.where(live, initial).to(ssm_state.dtype)
        return o[0]
