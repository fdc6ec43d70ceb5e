"""The contract every gated-DeltaNet backend keeps (the torch reference, our Triton kernels, fla).

Batches are flat over tokens: `cu_seqlens` [B+1] delimits the requests of a prefill, a decode has
one token per request. Request i owns state slot `slots[i]` of the layer's pools; its contents are
the request's state on entry and are updated in place. Slot 0 is the padding rows' scratch."""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from torch import Tensor

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.kernels.planar_out import PlanarOut


@runtime_checkable
class GDNBackend(Protocol):
    # True when decode (conv_decode, delta_decode) reads only device tensors, so a captured CUDA
    # graph replays it correctly; prefill is never captured.
    cuda_graph_safe: bool
    # True when prefill's q and k should come L2-normalised from conv_prefill (qk_norm), as rounded
    # values: fla's rule would round them so after its own norm, which then need not run. The
    # reference rule normalises them in fp32 itself, unrounded.
    prefill_conv_normalises_qk: bool

    def conv_prefill(
        self, x: Tensor, weight: Tensor, cu_seqlens: Tensor, conv_state: Tensor, slots: Tensor,
        max_len: int | None = None, out: PlanarOut | None = None, row_map: Tensor | None = None,
        qk_norm: tuple[int, int] | None = None,
    ) -> Tensor | PlanarOut:
        """x [T, C] pre-conv, weight [C, W], conv_state [N, C, W-1] -> silu(causal depthwise conv) [T, C],
        or into `out`'s rows from its row0 (returned). max_len: the longest request when the caller
        knows it on the host (it sizes a kernel's grid). row_map [T] int32: token t's output row
        (from row0), a permutation that keeps each request's pieces (cut at prefill_groups.PIECE_ALIGN
        from its first token) consecutive. qk_norm (channels, head_dim): the first `channels`
        outputs (q and k) L2-normalised over each head, as the delta rule would (DeltaInputs.qk_normed)."""
        ...

    def conv_decode(
        self, x: Tensor, weight: Tensor, conv_state: Tensor, slots: Tensor, out: PlanarOut | None = None
    ) -> Tensor | PlanarOut:
        """x [B, C], one token per request -> [B, C] (or into `out`); each slot's window shifts by one."""
        ...

    def delta_chunked(self, inp: DeltaInputs, cu_seqlens: Tensor, initial: Tensor | None,
                      lengths: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """The chunked gated delta rule over each request from its initial state (initial [N, HV, K, V]
        in any float dtype; None: zeros) -> (o [T, HV, V], final states [N, HV, K, V] fp32). Touches no
        pool: gdn/prefill_states.py moves the states. lengths: the requests' token counts when the
        caller knows them on the host (what cu_seqlens holds; a backend that needs them there reads
        them instead of waiting for the device)."""
        ...

    def delta_decode(self, inp: DeltaInputs, ssm_state: Tensor, slots: Tensor) -> Tensor:
        """One recurrent step per request (T = B) -> [B, HV, V]."""
        ...
