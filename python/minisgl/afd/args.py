"""AFD topology and runtime flags (`--afd-*`)."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.afd.mb_split import MB_SPLITS
from minisgl.arg_field import arg

LAUNCHERS = ("local", "ray")
DISPATCH_DTYPES = ("bf16", "fp8")
WARMUPS = ("auto", "on", "off")
TRANSPORTS = ("auto", "ipc", "p2p")


@dataclass(frozen=True)
class AfdArgs:
    attn_workers: int = arg(1, "M attention workers (AG), one data-parallel lane each: requests, KV and state "
                               "pools, attention/GDN, router, shared expert, sampling")
    expert_workers: int = arg(1, "N expert workers (EG), expert parallel: each owns num_experts / N routed experts")
    num_mb: int = arg(1, "micro-batches per lane step: 1 = serialized, 2 = ping-pong (the AG computes one "
                         "micro-batch while the EG runs the other's experts)")
    async_pending_steps: int = arg(2, "how far a worker's launches run ahead: step k + K is launched before it waits "
                                          "for step k's tokens; the coordinator leads by K + 1")
    dispatch_dtype: str = arg("bf16", "hidden states on the wire AG -> EG: bf16 (the model dtype) or fp8 "
                                      "(block-quantised, half the bytes)", DISPATCH_DTYPES)
    launcher: str = arg("local", "local: worker processes on this host, one GPU each (see --afd-gpus); ray: placed "
                                 "on the nodes of --afd-attn-nodes / --afd-expert-nodes", LAUNCHERS)
    transport: str = arg("auto", "the per-layer exchange: ipc (CUDA IPC buffers and device-side flags, no host "
                                 "sync per message; the workers must be GPUs of one host), p2p (torch.distributed "
                                 "send/recv: NCCL, gloo on the CPU), or auto (ipc where --afd-gpus makes workers "
                                 "share GPUs, else p2p: ipc between distinct GPUs has not run yet)", TRANSPORTS)
    gpus: int | None = arg(None, "local launcher: the GPUs of this host the workers use (cuda:0 .. N-1); fewer GPUs "
                                 "than workers share them round-robin, which needs the ipc transport and "
                                 "--afd-attn-tp-size 1 (NCCL refuses two ranks on one GPU). Default: one per worker")
    attn_nodes: str | None = arg(None, "ray: comma-separated node IPs for the attention workers")
    expert_nodes: str | None = arg(None, "ray: comma-separated node IPs for the expert workers")
    attn_tp_size: int = arg(1, "tensor-parallel ranks (GPUs) of each attention lane; only each lane's rank 0 talks "
                               "to the expert workers")
    step_timeout_s: float = arg(60.0, "the longest the coordinator waits for one step's replies before it reports "
                                      "the workers as failed")
    cpu_threads: int = arg(1, "torch threads per worker process on the CPU")
    mb_split: str = arg("count", "how a lane's requests split into micro-batches: count (equal numbers) or "
                                 "context (balanced full-attention context)", MB_SPLITS)
    layer_timing_dir: str | None = arg(None, "write per-layer timing JSON per step and worker here (off when "
                                             "unset, at no cost)")
    # Opt-in until measured on distinct GPUs: on one GPU (the only place it has run) a graph step of
    # the 122B took as long as an eager one, both bound by the workers' time slices
    # (docs/benchmarks.md, ninth session), while decode-only steps delay prefill.
    graph_buckets: bool = arg(False, "plan decode steps in decode-graph buckets (decode-only steps, every "
                                     "micro-batch padded to a bucket), which the workers replay as CUDA graphs "
                                     "where they can capture them (the ipc transport on GPUs) and run eagerly "
                                     "elsewhere, saying why")
    # Off on the CPU by default: nothing compiles there and no planner measures, and the steps up to
    # the largest prefill cost seconds; the CPU tests turn it on to check the lock step over gloo.
    warmup: str = arg("auto", "lock-step warm-up of every step shape through every worker before ready: auto (on "
                              "GPUs, off on the CPU), on or off", WARMUPS)

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
        if self.warmup not in WARMUPS:
            raise ValueError(f"--afd-warmup must be one of {WARMUPS}, got {self.warmup!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--afd-transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.gpus is not None and self.gpus < 1:
            raise ValueError(f"--afd-gpus must be >= 1, got {self.gpus}")
        if self.launcher == "ray" and self.transport == "ipc":
            raise ValueError("--afd-transport ipc maps buffers between processes of one host; the ray launcher may "
                             "place workers on several nodes: use --afd-transport p2p (or auto)")
        if self.launcher == "ray" and self.gpus is not None:
            raise ValueError("--afd-gpus places workers of the local launcher; Ray gives each worker a GPU of its own")
        if self.shares_gpus and self.transport == "p2p":
            raise ValueError(f"--afd-gpus {self.gpus} is fewer than the {self.world_size} workers, so workers share "
                             "GPUs, and NCCL refuses two ranks on one GPU: use --afd-transport ipc (or auto)")
        if self.shares_gpus and self.attn_tp_size > 1:
            raise ValueError(f"--afd-gpus {self.gpus} is fewer than the {self.world_size} workers, so workers share "
                             "GPUs; a lane's TP all-reduce runs on NCCL, which refuses two ranks on one GPU: "
                             "give every worker its own GPU or use --afd-attn-tp-size 1")
        if self.step_timeout_s <= 0:
            raise ValueError(f"--afd-step-timeout-s must be > 0, got {self.step_timeout_s}")

    @property
    def coordinator_lead(self) -> int:
        """Steps the coordinator may have sent but not seen replies for. It must exceed the workers'
        depth, or it would wait for a reply that needs a command it has not sent."""
        return self.async_pending_steps + 1

    @property
    def shares_gpus(self) -> bool:
        """--afd-gpus puts more than one worker on some GPU."""
        return self.gpus is not None and self.gpus < self.world_size

    def resolved_transport(self, devices: list[str]) -> str:
        """ipc or p2p for workers on these devices. auto takes ipc only where workers share GPUs (NCCL
        refuses them): between distinct GPUs the ipc path is untested (a copy into a peer GPU's
        memory also waits on that GPU's stream), so NCCL stays the default there until it has run."""
        cuda = all(d.startswith("cuda") for d in devices)
        if self.transport == "ipc" and not cuda:
            raise ValueError(f"--afd-transport ipc needs every worker on a CUDA GPU; the workers are on "
                             f"{sorted(set(devices))}")
        if self.transport == "auto":
            return "ipc" if cuda and self.shares_gpus else "p2p"
        return self.transport

    @property
    def world_size(self) -> int:
        """Attention lanes of attn_tp_size ranks each, then the expert workers."""
        return self.attn_workers * self.attn_tp_size + self.expert_workers
