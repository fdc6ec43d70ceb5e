"""The shared expert's contribution, handed to a routed-experts backend so it can add it in its own
epilogue (the Triton backend's combine) instead of three more passes over [T, H].

`add_to` is the reference: the torch ops MoE blocks always ran, so a backend that fuses the add
must round as they do (sigmoid in the logit's dtype, the product rounded, then the sum rounded)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SharedAddend:
    out: torch.Tensor  # [T, H] shared_expert(x): this rank's partial sum under TP
    gate_logit: torch.Tensor  # [T, 1] shared_expert_gate(x)

    def scale(self) -> torch.Tensor:
        """[T, 1] sigmoid(gate_logit), in the logit's dtype."""
        return torch.sigmoid(self.gate_logit)

    def gated(self) -> torch.Tensor:
        return self.scale() * self.out

    def add_to(self, routed: torch.Tensor) -> torch.Tensor:
        return routed + self.gated()
