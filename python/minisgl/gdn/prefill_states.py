"""A prefill call of the chunked gated delta rule with its requests' states moved in and out of the
pool: the one place that decides which states are read, handed on or written (backends compute
only, `GDNBackend.delta_chunked`).

Every read and write is a copy of a request's whole state (4 MiB a request and layer at 122B shapes),
so the flow (forward_batch.StateFlow) skips what the host knows is not needed: requests that start
here read zeros, not their slots; a pair of halves hands the first call's final states straight to
the second (fp32, as the rule carries them between its chunks, so a bf16 pool no longer rounds them
between the halves); the dummy slot 0 is never written.

A snapshot (forward_batch.Snapshot) writes a request's states at a point inside the step to a slot
of the prefix cache: the SSM state as the final state of the call that ends there (the pieces are
cut so), the conv window as the W-1 inputs before it (conv_snapshots)."""
from __future__ import annotations

import itertools
from typing import Sequence

import torch
from torch import Tensor

from minisgl.forward_batch import ForwardBatch, StateFlow
from minisgl.gdn.backend import GDNBackend
from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.host_copy import to_device


def delta_prefill(backend: GDNBackend, inp: DeltaInputs, cu_seqlens: Tensor, ssm_state: Tensor, slots: Tensor,
                  lengths: Sequence[int] | None = None, flow: StateFlow | None = None,
                  handed: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(o [T, HV, V], the final states when flow.hand_on else None). ssm_state [N, HV, K, V]: request
    i's state is slot slots[i]'s, or handed[i] (the previous call's hand-on); without a flow every
    state is read from the pool and written back."""
    if handed is not None:
        initial = handed
    elif flow is not None and flow.fresh:
        initial = None
    else:
        initial = ssm_state[slots]
    o, final = backend.delta_chunked(inp, cu_seqlens, initial, lengths)
    if flow is not None and flow.snapshots:
        rows, kept = zip(*flow.snapshots)  # both indexes pinned: a list index would wait for the queue
        ssm_state[to_device(kept, torch.int64, slots.device)] = \
            final[to_device(rows, torch.int64, slots.device)].to(ssm_state.dtype)
    if flow is not None and flow.hand_on:
        return o, final
    live = range(len(slots)) if flow is None else flow.live
    if len(live) == len(slots):
        ssm_state[slots] = final.to(ssm_state.dtype)
    elif live:
        rows = to_device(list(live), torch.int64, slots.device)
        ssm_state[slots[rows]] = final[rows].to(ssm_state.dtype)
    return o, None


def conv_snapshots(x: Tensor, conv_state: Tensor, part: ForwardBatch) -> None:
    """Write each snapshot's conv window: the last W-1 pre-conv inputs before its point, with the
    request's window on entry in front where the point is closer to its start. x [T, C]: the part's
    pre-conv rows in step order; call before the conv, which overwrites the windows on entry."""
    if not part.snapshots:
        return
    width = conv_state.shape[-1]
    starts = list(itertools.accumulate(part.extend_lens, initial=0))
    for s in part.snapshots:
        end = starts[s.request] + s.offset
        window = x[max(starts[s.request], end - width) : end].T
        if s.offset < width:
            window = torch.cat([conv_state[part.slot_ids[s.request], :, s.offset :], window], dim=1)
        conv_state[s.slot] = window
