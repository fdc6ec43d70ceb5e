"""AFD topology and runtime flags (`--afd-*`)."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.afd.mb_split import MB_SPLITS

LAUNCHERS = ("local", "ray")
DISPATCH_DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class AfdArgs:
    attn_workers: int = 1  # M attention workers, one data-parallel lane each
    expert_workers: int = 1  # N expert workers, expert parallel
    num_mb: int = 1  # micro-batches per lane step: 1 = serialized, 2 = ping-pong
    async_pending_steps: int = 2  # launched-but-unretired steps per worker; the coordinator leads by this + 1
    dispatch_dtype: str = "bf16"  # hidden states on the wire AG -> EG ("bf16" = the model dtype)
    launcher: str = "local"
    attn_nodes: str | None = None  # ray: comma-separated node IPs for the attention workers
    expert_nodes: str | None = None  # ray: node IPs for the expert workers
    attn_tp_size: int = 1  # tensor-parallel ranks inside each attention lane
    step_timeout_s: float = 60.0  # the longest the coordinator waits for one step's replies
    cpu_threads: int = 1  # torch threads per worker process on the CPU
    mb_split: str = "count"  # "count" | "context": balance full-attention context across micro-batches
    layer_timing_dir: str | None = None  # per-layer timing JSON per step and worker here; None = off, no cost

    def __post_init__(self) -> None:
        if self.attn_workers < 1:
            raise ValueError(f"--afd-attn-workers must be >= 1, got {self.attn_workers}")
        if self.expert_workers < 1:
            raise ValueError(f"--afd-expert-workers must be >= 1, got {self.expert_workers}")
        if self.num_mb < 1:
            raise ValueError(f"--afd-num-mb must be >= 1, got {self.num_mb}")
        if self.async_pending_steps < 1:
            raise ValueError(f"--afd-async-pending-steps must be >= 1, got {self.async_pending_steps}")
        if self.dispatch_dtype not in DISPATCH_DTYPES:
            raise ValueError(f"--afd-dispatch-dtype must be one of {DISPATCH_DTYPES}, got {self.dispatch_dtype!r}")
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"--afd-launcher must be one of {LAUNCHERS}, got {self.launcher!r}")
        if self.attn_tp_size < 1:
            raise ValueError(f"--afd-attn-tp-size must be >= 1, got {self.attn_tp_size}")
        if self.mb_split not in MB_SPLITS:
            raise ValueError(f"--afd-mb-split must be one of {MB_SPLITS}, got {self.mb_split!r}")
        if self.layer_timing_dir is not None and not self.layer_timing_dir.strip():
            raise ValueError("--afd-layer-timing-dir must be a directory path (leave it unset to turn timing off)")
        if self.step_timeout_s <= 0:
            raise ValueError(f"--afd-step-timeout-s must be > 0, got {self.step_timeout_s}")

    @property
    def coordinator_lead(self) -> int:
        """Steps the coordinator may have sent but not seen replies for. It must exceed the workers'
        depth, or it would wait for a reply that needs a command it has not sent."""
        return self.async_pending_steps + 1

    @property
    def world_size(self) -> int:
        """Attention lanes of attn_tp_size ranks each, then the expert workers."""
        return self.attn_workers * self.attn_tp_size + self.expert_workers
