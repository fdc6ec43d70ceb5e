"""Per-layer token exchange between attention workers (AG) and expert workers (EG) over
torch.distributed point-to-point: gloo on the CPU, NCCL between GPUs that are not one host's (the
GPUs of one host take afd/ipc_transport.py). The messages are afd/exchange.py's; buffers are
static per (bucket, mb).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from minisgl.afd.exchange import Exchange, PendingCombine, PendingDispatch

_DISPATCH_TAG, _COMBINE_TAG = 0, 1 << 16


class Transport(Exchange):
    """One process's end of the exchange over torch.distributed."""

    def __init__(
        self, rank: int, num_ag: int, num_eg: int, hidden: int, top_k: int, dtype: torch.dtype,
        fp8_dispatch: bool, device: torch.device, lane_tp: int = 1,
    ) -> None:
        super().__init__(rank, num_ag, num_eg, hidden, top_k, dtype, fp8_dispatch, device, lane_tp)
        # One group per direction. NCCL runs each group's point-to-point batches in order on one
        # stream and ignores tags: with a single group an expert worker's pre-posted receive of
        # micro-batch i+1 would queue ahead of its send of micro-batch i's combine, which the
        # attention worker needs before it can send micro-batch i+1 -- a deadlock gloo never shows.
        # Every rank builds its Transport once, right after joining, so the calls line up.
        self.dispatch_group = dist.new_group()
        self.combine_group = dist.new_group()

    # -- attention-worker side ------------------------------------------------------------------
    def dispatch(self, mb: int, bucket: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> PendingCombine:
        """Send x [T, H] with its routing to every EG and post the receives of their partial sums."""
        buf = self.pack(mb, bucket, x, ids, weights)
        partials = self._buffer("ag_recv", bucket, mb, (self.num_eg, bucket, self.hidden), self.dtype)
        recvs = [
            dist.P2POp(dist.irecv, partials[i], r, self.combine_group, _COMBINE_TAG + mb)
            for i, r in enumerate(self.eg_ranks)
        ]
        sends = [dist.P2POp(dist.isend, buf, r, self.dispatch_group, _DISPATCH_TAG + mb) for r in self.eg_ranks]
        works = dist.batch_isend_irecv(recvs) + dist.batch_isend_irecv(sends)
        return PendingCombine(works, partials, x.shape[0], mb)

    def combine(self, pending: PendingCombine) -> torch.Tensor:
        """Wait for every EG's partial sum and add them up: [T, H]."""
        for w in pending.works:
            w.wait()
        return pending.partials[:, : pending.num_tokens].sum(dim=0)

    # -- expert-worker side ---------------------------------------------------------------------
    def post_receive(self, mb: int, bucket: int) -> PendingDispatch:
        layout = self.layout(bucket)
        bufs = self._buffer("eg_recv", bucket, mb, (self.num_ag, layout.nbytes), torch.uint8)
        ops = [dist.P2POp(dist.irecv, bufs[a], r, self.dispatch_group, _DISPATCH_TAG + mb)
               for a, r in enumerate(self.ag_ranks)]
        return PendingDispatch(dist.batch_isend_irecv(ops), bufs, layout, mb)

    def receive(self, pending: PendingDispatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All AGs' rows, concatenated: (hidden [M·bucket, H] in the model dtype, ids, weights)."""
        for w in pending.works:
            w.wait()
        return self.unpack(pending.bufs, pending.layout)

    def send_combine(self, mb: int, bucket: int, out: torch.Tensor) -> list:
        """Return each AG its rows of the partial sums out [M·bucket, H]."""
        buf = self._buffer("eg_send", bucket, mb, (self.num_ag, bucket, self.hidden), self.dtype)
        buf.copy_(out.view(self.num_ag, bucket, self.hidden))
        ops = [dist.P2POp(dist.isend, buf[a], r, self.combine_group, _COMBINE_TAG + mb)
               for a, r in enumerate(self.ag_ranks)]
        return dist.batch_isend_irecv(ops)
