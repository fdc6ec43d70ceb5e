"""Reference GDN backend in plain torch: the CPU path, and the ground truth for GPU kernels.

Varlen batches are flat over tokens with `cu_seqlens` [B+1] delimiting requests; request i owns
state slot `slots[i]` in the per-layer pools, whose contents are its initial state (the pool zeroes a
slot before a request's first prefill). States are updated in place.

Padding: decode rows whose slot is 0 (the dummy) are computed like real rows and their state is
written to slot 0, which is scratch; when several padding rows share slot 0, which write lands is
unspecified. Real requests must carry distinct non-zero slots. Prefill's chunked rule touches no
pool (gdn/prefill_states.py moves its states).
"""
from __future__ import annotations

import itertools
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.reference_math import chunk_gated_delta_rule, gated_delta_step, l2norm, prepare_qk
from minisgl.kernels.planar_out import PlanarOut


def _written(values: Tensor, out: PlanarOut | None, row_map: Tensor | None = None) -> Tensor | PlanarOut:
    if row_map is not None:
        values = torch.empty_like(values).index_copy_(0, row_map.long(), values)
    if out is None:
        return values
    out.write(values)
    return out


class TorchGDNBackend:
    """Math is fp32 throughout; outputs come back in the input dtype and states in the pool dtype."""

    cuda_graph_safe = True  # decode reads only device tensors (prefill is never captured)
    prefill_conv_normalises_qk = False

    def conv_prefill(
        self, x: Tensor, weight: Tensor, cu_seqlens: Tensor, conv_state: Tensor, slots: Tensor,
        max_len: int | None = None, out: PlanarOut | None = None, row_map: Tensor | None = None,
        qk_norm: tuple[int, int] | None = None,
    ) -> Tensor | PlanarOut:
        """x [T, C] pre-conv, weight [C, W], conv_state [N, C, W-1] -> silu(causal depthwise conv) [T, C],
        or into `out` from its row0; token t to row row_map[t] when given. max_len: the longest
        request, when the caller knows it on the host (sizes a GPU kernel's grid). qk_norm (channels,
        head_dim): the first channels L2-normalised over each head."""
        channels, width = weight.shape
        kernel = weight.float()[:, None, :]
        y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        bounds = cu_seqlens.tolist()
        for i, slot in enumerate(slots.tolist()):
            start, end = bounds[i], bounds[i + 1]
            # History then this request's inputs, [C, W-1+L]; a valid conv over it yields exactly L outputs.
            seq = torch.cat([conv_state[slot].float(), x[start:end].float().T], dim=1)
            y[start:end] = F.silu(F.conv1d(seq[None], kernel, groups=channels)[0]).T
            # The last W-1 columns include old history when L < W-1, so short requests shift the state.
            conv_state[slot] = seq[:, seq.shape[1] - (width - 1) :]
        if qk_norm is not None:  # of the rounded outputs, as the rule would read them
            channels, head = qk_norm
            y[:, :channels] = l2norm(y[:, :channels].to(x.dtype).float().unflatten(1, (-1, head))).flatten(1)
        return _written(y.to(x.dtype), out, row_map)

    def conv_decode(
        self, x: Tensor, weight: Tensor, conv_state: Tensor, slots: Tensor, out: PlanarOut | None = None
    ) -> Tensor | PlanarOut:
        """x [B, C], one token per request -> [B, C] (or into `out`); each slot's window shifts by one."""
        seq = torch.cat([conv_state[slots].float(), x.float()[:, :, None]], dim=2)  # [B, C, W]
        y = F.silu((seq * weight.float()).sum(-1))
        conv_state[slots] = seq[:, :, 1:].to(conv_state.dtype)
        return _written(y.to(x.dtype), out)

    def delta_chunked(self, inp: DeltaInputs, cu_seqlens: Tensor, initial: Tensor | None,
                      lengths: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """inp varlen over cu_seqlens from `initial` [N, HV, K, V] (None: zeros) -> (o [T, HV, V],
        final states [N, HV, K, V] fp32)."""
        q, k = prepare_qk(inp.q, inp.k, inp.v.shape[-2], normed=inp.qk_normed)
        g, beta = inp.gates()
        v = inp.v.float()
        out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        bounds = cu_seqlens.tolist() if lengths is None else [0, *itertools.accumulate(lengths)]
        hv, dk, dv = v.shape[1], q.shape[-1], v.shape[-1]
        final = torch.zeros((len(bounds) - 1, hv, dk, dv), dtype=torch.float32, device=v.device)
        for i in range(len(bounds) - 1):
            s, e = bounds[i], bounds[i + 1]
            start = final[i] if initial is None else initial[i].float()
            out[s:e], final[i] = chunk_gated_delta_rule(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], start)
        return out.to(inp.v.dtype), final

    def delta_decode(self, inp: DeltaInputs, ssm_state: Tensor, slots: Tensor) -> Tensor:
        """inp of one token per request (T = B): one recurrent step per request -> [B, HV, V]."""
        q, k = prepare_qk(inp.q, inp.k, inp.v.shape[-2])
        g, beta = inp.gates()
        out, state = gated_delta_step(q, k, inp.v.float(), g, beta, ssm_state[slots].float())
        ssm_state[slots] = state.to(ssm_state.dtype)
        return out.to(inp.v.dtype)
