"""Which expert worker owns which routed experts: EG rank r owns [r·E/N, (r+1)·E/N)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExpertPlan:
    num_experts: int
    num_workers: int

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"need at least one expert worker, got {self.num_workers}")
        if self.num_experts % self.num_workers:
            raise ValueError(
                f"{self.num_experts} experts cannot be split evenly over {self.num_workers} expert workers "
                f"(E % N must be 0)"
            )

    @property
    def per_worker(self) -> int:
        return self.num_experts // self.num_workers

    def owned(self, rank: int) -> tuple[int, int]:
        """[start, end) of the experts EG rank `rank` owns."""
        if not 0 <= rank < self.num_workers:
            raise ValueError(f"expert worker rank {rank} out of range [0, {self.num_workers})")
        return rank * self.per_worker, (rank + 1) * self.per_worker

    def owner(self, expert: int) -> int:
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} out of range [0, {self.num_experts})")
        return expert // self.per_worker
