"""Which rank of which tensor-parallel group this process is, and how the MoE experts are split.

Expert parallelism runs over the tensor-parallel ranks (as SGLang's --ep-size does): with TP t and
EP e (e divides t), the experts are split into e owner groups and each expert's intermediate
dimension over the t / e ranks of its group. Attention, GDN, the shared expert and the vocabulary
are always split over all t ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def even_part(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part `index` when `total` splits evenly into `parts`."""
    if total % parts:
        raise ValueError(f"{total} does not split evenly into {parts} parts")
    size = total // parts
    return index * size, (index + 1) * size


def check_sizes(tp_size: int, ep_size: int) -> None:
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if ep_size < 1:
        raise ValueError(f"ep_size must be >= 1, got {ep_size}")
    if tp_size % ep_size:
        raise ValueError(
            f"ep_size {ep_size} must divide tp_size {tp_size}: the expert-parallel ranks are the tensor-parallel "
            f"ranks (e.g. --tp-size 8 --ep-size 8, or --tp-size 8 --ep-size 2 for 2 expert groups of 4)"
        )


@dataclass(frozen=True)
class ParallelConfig:
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    # Global ranks of the group's members, tensor-parallel rank order (rank 0 leads: it samples,
    # and its step inputs are broadcast to the others).
    ranks: tuple[int, ...] = (0,)
    group: object | None = field(default=None, compare=False, repr=False)  # torch.distributed ProcessGroup

    def __post_init__(self) -> None:
        check_sizes(self.tp_size, self.ep_size)
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} out of range [0, {self.tp_size})")
        if len(self.ranks) != self.tp_size:
            raise ValueError(f"a TP group of {self.tp_size} needs {self.tp_size} global ranks, got {self.ranks}")
        if self.tp_size > 1 and self.group is None:
            raise ValueError("a tensor-parallel config of more than one rank needs its process group")

    @property
    def moe_tp_size(self) -> int:
        """Ranks that share one expert's intermediate dimension."""
        return self.tp_size // self.ep_size

    @property
    def ep_rank(self) -> int:
        return self.tp_rank // self.moe_tp_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def leader(self) -> int:
        """Global rank of TP rank 0."""
        return self.ranks[0]

    @property
    def is_leader(self) -> bool:
        return self.tp_rank == 0

    def part(self, total: int) -> tuple[int, int]:
        """This rank's [start, end) of `total` split evenly over the TP ranks."""
        return even_part(total, self.tp_size, self.tp_rank)

    def kv_head_range(self, num_kv_heads: int) -> tuple[int, int]:
        """This rank's KV heads: an even split, or, with fewer KV heads than ranks, the one head its
        query heads read (replicated on tp / num_kv_heads ranks)."""
        if num_kv_heads >= self.tp_size:
            return self.part(num_kv_heads)
        head = self.tp_rank * num_kv_heads // self.tp_size
        return head, head + 1

    def expert_range(self, num_experts: int) -> tuple[int, int]:
        """The routed experts this rank's EP group owns."""
        return even_part(num_experts, self.ep_size, self.ep_rank)

    def moe_intermediate_range(self, intermediate: int) -> tuple[int, int]:
        """This rank's slice of each of its experts' intermediate dim."""
        return even_part(intermediate, self.moe_tp_size, self.moe_tp_rank)


SINGLE = ParallelConfig()
