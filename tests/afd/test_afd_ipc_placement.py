"""What decides the one-GPU (and one-node) transport, on the CPU: --afd-transport and --afd-gpus
are validated with errors naming the flag, workers share GPUs round-robin only with the ipc
transport, the default process group joins over gloo when nothing needs NCCL, and the ipc
transport's static buffers hold the largest bucket any step can use. (The transport itself needs a
GPU: tests/gpu/test_afd_ipc.py.)"""
from __future__ import annotations

import argparse

import pytest
import torch

from minisgl.afd import launch
from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import decode_graph_buckets, largest_bucket
from minisgl.afd.ipc_transport import IpcTransport
from minisgl.afd.protocol import ATTN, WorkerSpec
from minisgl.afd.transport_choice import process_group_backend, uses_ipc
from minisgl.afd.warmup import warmup_steps
from minisgl.afd.worker_group import WorkerGroup
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.server.cli_args import add_dataclass_args, dataclass_from


@pytest.mark.parametrize("kwargs,match", [
    ({"transport": "nvlink"}, "--afd-transport must be one of"),
    ({"gpus": 0}, "--afd-gpus must be >= 1"),
    ({"launcher": "ray", "transport": "ipc"}, "--afd-transport ipc .* one host"),
    ({"launcher": "ray", "gpus": 1}, "--afd-gpus places workers of the local launcher"),
    ({"gpus": 1, "transport": "p2p"}, "--afd-gpus 1 is fewer than the 2 workers.*--afd-transport ipc"),
    ({"gpus": 2, "attn_workers": 2, "attn_tp_size": 2}, "--afd-gpus 2 .* --afd-attn-tp-size 1"),
])
def test_bad_combinations_name_the_flag(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AfdArgs(**kwargs)


def test_good_combinations() -> None:
    AfdArgs(gpus=1, transport="ipc")
    AfdArgs(gpus=1)  # auto
    AfdArgs(gpus=2, transport="p2p")  # one GPU each: NCCL is fine
    AfdArgs(attn_tp_size=2, transport="ipc")  # lane TP over NCCL, the exchange over IPC, one GPU each


def test_flags_parse() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_args(parser, AfdArgs, prefix="afd_")
    afd = dataclass_from(parser.parse_args(["--afd-transport", "ipc", "--afd-gpus", "1"]), AfdArgs, prefix="afd_")
    assert (afd.transport, afd.gpus, afd.shares_gpus) == ("ipc", 1, True)
    with pytest.raises(SystemExit):
        parser.parse_args(["--afd-transport", "nccl"])


@pytest.mark.parametrize("afd,devices,want", [
    (AfdArgs(), ["cpu", "cpu"], "p2p"),
    (AfdArgs(), ["cuda:0", "cuda:1"], "p2p"),
    (AfdArgs(gpus=1), ["cuda:0", "cuda:0"], "ipc"),
    (AfdArgs(launcher="ray"), ["cuda:0", "cuda:1"], "p2p"),
    (AfdArgs(transport="p2p"), ["cuda:0", "cuda:1"], "p2p"),
    (AfdArgs(transport="ipc"), ["cuda:0", "cuda:1"], "ipc"),
])
def test_auto_takes_ipc_for_shared_gpus_only(afd: AfdArgs, devices: list[str], want: str) -> None:
    assert afd.resolved_transport(devices) == want


def test_ipc_refuses_cpu_workers() -> None:
    with pytest.raises(ValueError, match="--afd-transport ipc needs every worker on a CUDA GPU"):
        AfdArgs(transport="ipc").resolved_transport(["cpu", "cpu"])
    with pytest.raises(ValueError, match="--afd-transport ipc needs CUDA devices"):
        IpcTransport(0, 1, 1, 128, 2, torch.float32, False, torch.device("cpu"), num_mb=1, max_bucket=8,
                     timeout_s=1.0)


class _CpuLauncher:
    host = "127.0.0.1"

    def devices(self, afd: AfdArgs) -> list[str]:
        return ["cpu"] * afd.world_size

    def start(self, specs) -> None:
        raise AssertionError("a worker started")


def test_ipc_on_cpu_fails_before_any_worker_starts(tiny_checkpoints) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu"))
    with pytest.raises(ValueError, match="--afd-transport ipc"):
        WorkerGroup(plan, AfdArgs(transport="ipc"), _CpuLauncher(), max_bucket=64)


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("afd,count,want", [
    (AfdArgs(attn_workers=2, expert_workers=2), 4, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]),
    (AfdArgs(attn_workers=2, expert_workers=2), 8, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]),
    (AfdArgs(attn_workers=2, expert_workers=2, gpus=1), 1, ["cuda:0"] * 4),
    (AfdArgs(attn_workers=2, expert_workers=1, gpus=2), 8, ["cuda:0", "cuda:1", "cuda:0"]),
    (AfdArgs(attn_workers=1, expert_workers=1), 0, ["cpu", "cpu"]),
])
def test_worker_devices(monkeypatch, afd: AfdArgs, count: int, want: list[str]) -> None:
    _gpus(monkeypatch, count)
    assert launch.worker_devices(afd) == want


@pytest.mark.parametrize("afd,count,match", [
    (AfdArgs(attn_workers=2, expert_workers=2), 2, "AFD needs 4 GPUs on this host for 2\\+2 workers, one GPU each "
                                                   "\\(--afd-gpus shares fewer\\), found 2"),
    (AfdArgs(gpus=2), 1, "AFD needs 2 GPUs on this host for --afd-gpus 2, found 1"),
    (AfdArgs(gpus=1), 0, "--afd-gpus 1 places workers on GPUs, and this host has none"),
])
def test_worker_devices_refuse(monkeypatch, afd: AfdArgs, count: int, match: str) -> None:
    _gpus(monkeypatch, count)
    with pytest.raises(ValueError, match=match):
        launch.worker_devices(afd)


def _spec(afd: AfdArgs, device: str) -> WorkerSpec:
    return WorkerSpec(ATTN, 0, 0, ("127.0.0.1", 1), "tcp://a", "tcp://b", None, afd, device)


@pytest.mark.parametrize("afd,device,backend,ipc", [
    (AfdArgs(), "cpu", "gloo", False),
    (AfdArgs(), "cuda:0", "nccl", False),  # auto between distinct GPUs: p2p over NCCL
    (AfdArgs(gpus=1), "cuda:0", "gloo", True),  # auto on a shared GPU: ipc, and nothing else needs NCCL
    (AfdArgs(transport="ipc"), "cuda:0", "gloo", True),
    (AfdArgs(transport="p2p"), "cuda:0", "nccl", False),
    (AfdArgs(transport="ipc", attn_tp_size=2), "cuda:0", "nccl", True),  # the lane's all-reduces
])
def test_process_group_backend(afd: AfdArgs, device: str, backend: str, ipc: bool) -> None:
    spec = _spec(afd, device)
    assert process_group_backend(spec) == backend
    assert uses_ipc(spec) == ipc


@pytest.mark.parametrize("engine,budget,want", [
    # 4 slots of decodes beside min(16384, 4 * min(16, 255), pages) = 64 prompt tokens: 68 -> 128.
    (dict(max_running_requests=4, chunked_prefill_size=16, context_length=256), 16384, 128),
    # The prefill budget binds: 8 + 100 -> 128.
    (dict(max_running_requests=8, chunked_prefill_size=64, context_length=256), 100, 128),
    # The pages bind: 8 slots + about 20 pages of 16 (320), not 8 * 255 -> 512, not 2048.
    (dict(max_running_requests=8, chunked_prefill_size=512, context_length=256, num_pages=20), 16384, 512),
])
def test_largest_bucket(tiny_checkpoints, engine: dict, budget: int, want: int) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", dtype="float32", page_size=16,
                                   **engine))
    assert largest_bucket(plan, budget) == want
    # It holds every warm-up step's bucket, which covers every shape class a step takes.
    for mb in (1, 2):
        for graphs in (False, True):
            afd = AfdArgs(num_mb=mb, graph_buckets=graphs)
            steps = warmup_steps(plan, afd, decode_graph_buckets(plan, afd), budget)
            assert max(s.bucket for s in steps) <= want
