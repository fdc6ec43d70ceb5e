"""The MoE block on an attention worker: router and shared expert run here, the routed experts on
the expert workers. The decoder layer calls it like any MoE block; the micro-batch driver calls
dispatch and combine separately so the other micro-batch computes while the experts run.

In a lane with tensor parallelism every rank holds the same tokens: only TP rank 0 routes and
exchanges with the expert workers (once per lane), each rank computes its slice of the shared
expert, and one all-reduce over the lane sums rank 0's routed output with the shared partials."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.afd.exchange import Exchange, PendingCombine
from minisgl.kernels.activations import Activations, tensor
from minisgl.moe.block import MoEBlock
from minisgl.parallel.collectives import all_reduce
from minisgl.parallel.config import SINGLE, ParallelConfig


@dataclass
class InFlight:
    pending: PendingCombine | None  # None on a lane's other TP ranks
    shared: torch.Tensor | None
    x: torch.Tensor  # the block's input: the shape of its output


class StepState:
    """The per-step facts every remote block needs: the dispatch bucket agreed for this step."""

    bucket: int = 0


class RemoteMoE(MoEBlock):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        shared_intermediate: int,
        renormalize: bool,
        transport: Exchange | None,
        step: StepState,
        parallel: ParallelConfig = SINGLE,
    ) -> None:
        """transport: None on the lane's TP ranks other than 0."""
        super().__init__(hidden, num_experts, top_k, renormalize, parallel)
        self.add_shared_expert(hidden, shared_intermediate)
        self.transport = transport
        self.step = step

    def dispatch(self, x: torch.Tensor | Activations, mb: int) -> InFlight:
        """Sends x's rows (the tensor: its codes stay here) and runs the shared expert, which reads
        x's codes where the norm before the block wrote them."""
        rows, pending = tensor(x), None
        if self.transport is not None:
            weights, ids = self.route(x)
            pending = self.transport.dispatch(mb, self.step.bucket, rows, ids.int(), weights.float())
        # The shared expert runs while the expert workers compute the routed ones.
        return InFlight(pending, self.shared(x), rows)

    def combine(self, inflight: InFlight) -> torch.Tensor:
        out = None if inflight.pending is None else self.transport.combine(inflight.pending)
        if inflight.shared is not None:
            out = inflight.shared if out is None else out + inflight.shared
        if out is None:  # a lane's other rank without a shared expert: rank 0's output arrives in the all-reduce
            out = torch.zeros_like(inflight.x)
        return all_reduce(out, self.parallel)

    def forward(self, x: torch.Tensor | Activations, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output for x, or `residual +` it (the decoder layer's residual add)."""
        out = self.combine(self.dispatch(x, mb=0))
        return out if residual is None else residual + out
