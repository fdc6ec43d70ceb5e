"""GDN backend on our Triton kernels: conv1d prefill/update and the in-place recurrent decode.

Prefill's gated delta rule stays on the torch chunked reference: the triton backend needs nothing
beyond triton, and `fla` (gdn/fla_backend.py) is the one that swaps in fla's chunked kernel. Each
name means one fixed set of kernels, so a run's backend never depends on what happens to be installed.

Padding differs from the torch reference in one defined way: a decode row whose slot is 0 gets a
zero output and reads and writes no state, so slot 0 is never written (the torch backend computes
such rows and scribbles on slot 0, which is scratch). Real requests carry distinct non-zero slots.
"""
from __future__ import annotations

from torch import Tensor

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.torch_backend import TorchGDNBackend
from minisgl.kernels.conv1d import conv1d_prefill, conv1d_update
from minisgl.kernels.gated_delta_decode import gated_delta_decode
from minisgl.kernels.planar_out import PlanarOut


class TritonGDNBackend(TorchGDNBackend):
    def conv_prefill(
        self, x: Tensor, weight: Tensor, cu_seqlens: Tensor, conv_state: Tensor, slots: Tensor,
        max_len: int | None = None, out: PlanarOut | None = None, row_map: Tensor | None = None,
        qk_norm: tuple[int, int] | None = None,
    ) -> Tensor | PlanarOut:
        return conv1d_prefill(x, weight, cu_seqlens, conv_state, slots, out=out, max_len=max_len, row_map=row_map,
                              qk_norm=qk_norm)

    def conv_decode(
        self, x: Tensor, weight: Tensor, conv_state: Tensor, slots: Tensor, out: PlanarOut | None = None
    ) -> Tensor | PlanarOut:
        return conv1d_update(x, weight, conv_state, slots, out=out)

    def delta_decode(self, inp: DeltaInputs, ssm_state: Tensor, slots: Tensor) -> Tensor:
        return gated_delta_decode(inp.q, inp.k, inp.v, inp.a, inp.b, inp.A_log, inp.dt_bias, ssm_state, slots)
