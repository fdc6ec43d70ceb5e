"""GDN backend "fla": our Triton conv and decode kernels, with prefill's gated delta rule on
flash-linear-attention's varlen `chunk_gated_delta_rule` (importing this module needs fla).

Prefill runs a call of requests (prefill_groups.py) as one varlen call from the initial states
gdn/prefill_states.py gathers (or hands on), which scatters the final states back; prefill is
compute-bound, so the copies cost little there, unlike decode, which updates the pool in place
(kernels/gated_delta_decode.py).
"""
from __future__ import annotations

from typing import Sequence

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from torch import Tensor

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.triton_backend import TritonGDNBackend
from minisgl.host_copy import to_device

# fla's chunk length in chunk_gated_delta_rule (its kernels' BT).
FLA_CHUNK = 64
# Varlen metadata kept per cu_seqlens object: a step's request groups (prefill_groups.py) and, under
# AFD, its micro-batches; every GDN layer of the step reuses them.
_KEPT_VARLEN = 16


def chunk_indices(lengths: Sequence[int]) -> list[int]:
    """fla's chunk indices of a varlen batch, flat: (request, chunk within it) for every FLA_CHUNK
    tokens of every request. fla builds them from cu_seqlens on the device, which waits for it."""
    return [v for i, n in enumerate(lengths) for c in range(-(-n // FLA_CHUNK)) for v in (i, c)]


class FlaGDNBackend(TritonGDNBackend):
    # fla's L2 norm autotunes per band of tokens x key heads (a compile for each band a step size
    # reaches); the conv normalises q and k instead, in one pass it makes anyway.
    prefill_conv_normalises_qk = True

    def __init__(self) -> None:
        super().__init__()
        # (cu_seqlens, (its int64 copy, fla's chunk indices or None)), newest last.
        self._varlen: list[tuple[Tensor, tuple[Tensor, Tensor | None]]] = []

    def _varlen_args(self, cu_seqlens: Tensor, lengths: Sequence[int] | None) -> tuple[Tensor, Tensor | None]:
        """The same tensors for every GDN layer of a step. Given the lengths, the chunk indices come
        from the host without waiting; else fla builds them (one sync per cu_seqlens object: fla
        caches them per tensor object, so the int64 copy must be the same object each layer)."""
        for seen, args in self._varlen:
            if seen is cu_seqlens:
                return args
        indices = None
        if lengths is not None:
            indices = to_device(chunk_indices(lengths), torch.int64, cu_seqlens.device).view(-1, 2)
        args = (cu_seqlens.long(), indices)
        self._varlen = [*self._varlen[1 - _KEPT_VARLEN :], (cu_seqlens, args)]
        return args

    def delta_chunked(self, inp: DeltaInputs, cu_seqlens: Tensor, initial: Tensor | None,
                      lengths: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """inp varlen over cu_seqlens from `initial` (None: zeros) -> (o [T, HV, V], final states fp32)."""
        g, beta = inp.gates()  # fp32, exactly the reference's gates
        cu, indices = self._varlen_args(cu_seqlens, lengths)
        o, final = chunk_gated_delta_rule(
            inp.q[None], inp.k[None], inp.v[None], g[None], beta[None],
            scale=inp.q.shape[-1] ** -0.5,
            initial_state=initial,
            output_final_state=True,
            use_qk_l2norm_in_kernel=not inp.qk_normed,
            cu_seqlens=cu,
            chunk_indices=indices,
        )
        return o[0], final
