"""Which transport a worker exchanges through (--afd-transport), and so which backend its default
process group needs: with the ipc transport nothing but a lane's TP collectives needs NCCL, and
NCCL refuses two ranks on one GPU, so workers sharing GPUs join over gloo."""
from __future__ import annotations

import torch

from minisgl.afd.exchange import Exchange
from minisgl.afd.ipc_transport import IpcTransport
from minisgl.afd.protocol import WorkerSpec
from minisgl.afd.transport import Transport


def uses_ipc(spec: WorkerSpec) -> bool:
    return spec.afd_args.resolved_transport([spec.device]) == "ipc"


def process_group_backend(spec: WorkerSpec) -> str:
    """NCCL where a GPU worker needs it (the p2p transport, a lane's TP all-reduces), else gloo."""
    cuda = spec.device.startswith("cuda")
    return "nccl" if cuda and (not uses_ipc(spec) or spec.afd_args.attn_tp_size > 1) else "gloo"


def make_transport(spec: WorkerSpec, hidden: int, top_k: int, dtype: torch.dtype, device: torch.device,
                   lane_tp: int = 1) -> Exchange:
    """Every rank builds its transport once, right after joining: both kinds create process groups."""
    afd = spec.afd_args
    args = (spec.rank, afd.attn_workers, afd.expert_workers, hidden, top_k, dtype, afd.dispatch_dtype == "fp8", device)
    if uses_ipc(spec):
        return IpcTransport(*args, num_mb=afd.num_mb, max_bucket=spec.max_bucket, timeout_s=afd.step_timeout_s,
                            lane_tp=lane_tp)
    return Transport(*args, lane_tp=lane_tp)
