"""The MoE block on an attention worker: router and shared expert run here, the routed experts on
the expert workers. The decoder layer calls it like any MoE block; the micro-batch driver calls
dispatch and combine separately so the other micro-batch computes while the experts run."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minisgl.afd.transport import PendingCombine, Transport
from minisgl.layers.linear import Linear
from minisgl.moe.local_moe import SharedExpert
from minisgl.moe.router import route


@dataclass
class InFlight:
    pending: PendingCombine
    shared: torch.Tensor | None


class StepState:
    """The per-step facts every remote block needs: the dispatch bucket agreed for this step."""

    bucket: int = 0


class RemoteMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        shared_intermediate: int,
        renormalize: bool,
        transport: Transport,
        step: StepState,
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Linear(hidden, num_experts)
        self.shared_expert: SharedExpert | None = None
        self.shared_expert_gate: Linear | None = None
        if shared_intermediate:
            self.shared_expert = SharedExpert(hidden, shared_intermediate)
            self.shared_expert_gate = Linear(hidden, 1)
        self.transport = transport
        self.step = step

    def dispatch(self, x: torch.Tensor, mb: int) -> InFlight:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        pending = self.transport.dispatch(mb, self.step.bucket, x, ids.int(), weights.float())
        # The shared expert runs while the expert workers compute the routed ones.
        shared = None
        if self.shared_expert is not None:
            shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return InFlight(pending, shared)

    def combine(self, inflight: InFlight) -> torch.Tensor:
        out = Transport.combine(inflight.pending)
        return out if inflight.shared is None else out + inflight.shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine(self.dispatch(x, mb=0))
