"""Starting and stopping the workers: as local processes (default), or as Ray actors when Ray is
installed (`pip install -e .[ray]`) for multi-node placement."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
from typing import Protocol

import torch

from minisgl.afd.args import AfdArgs
from minisgl.afd.protocol import ATTN, WorkerSpec
from minisgl.afd.worker import worker_main

logger = logging.getLogger(__name__)


def worker_devices(afd: AfdArgs) -> list[str]:
    """Attention workers first, then expert workers: one GPU each by default, or round-robin over
    --afd-gpus GPUs (all on cuda:0 with 1); the CPU when there is no GPU."""
    n = afd.world_size
    if not torch.cuda.is_available():
        if afd.gpus is not None:
            raise ValueError(f"--afd-gpus {afd.gpus} places workers on GPUs, and this host has none")
        return ["cpu"] * n
    gpus = afd.gpus or n
    if torch.cuda.device_count() < gpus:
        why = (f"--afd-gpus {gpus}" if afd.gpus else
               f"{afd.attn_workers}+{afd.expert_workers} workers, one GPU each (--afd-gpus shares fewer)")
        raise ValueError(f"AFD needs {gpus} GPUs on this host for {why}, found {torch.cuda.device_count()}")
    return [f"cuda:{i % gpus}" for i in range(n)]


class Launcher(Protocol):
    host: str  # the address workers reach the coordinator at

    def devices(self, afd: AfdArgs) -> list[str]:
        """The device of each worker, attention workers first."""

    def start(self, specs: list[WorkerSpec]) -> None: ...

    def dead(self) -> list[str]:
        """A line per worker that has exited: its name and why."""

    def stop(self, timeout_s: float) -> None: ...


class LocalLauncher:
    host = "127.0.0.1"

    def __init__(self) -> None:
        self.procs: dict[str, mp.process.BaseProcess] = {}

    def devices(self, afd: AfdArgs) -> list[str]:
        return worker_devices(afd)

    def start(self, specs: list[WorkerSpec]) -> None:
        ctx = mp.get_context("spawn")  # fork would copy the coordinator's threads and torch state
        for spec in specs:
            p = ctx.Process(target=worker_main, args=(spec,), name=f"minisgl-{spec.name}", daemon=True)
            p.start()
            self.procs[spec.name] = p

    def dead(self) -> list[str]:
        # Killed ones first: a worker killed by a signal is the cause, its peers' errors the effect.
        gone = sorted((p.exitcode, name, p.pid) for name, p in self.procs.items() if p.exitcode is not None)
        return [f"worker {name} (pid {pid}) " + (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
                for code, name, pid in gone]

    def stop(self, timeout_s: float) -> None:
        for p in self.procs.values():
            p.join(timeout_s)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)


class RayLauncher:
    """Attention workers on the attention nodes, expert workers on the expert nodes (the last node
    when none are given). Each worker is an actor whose task runs worker_main."""

    def __init__(self, afd: AfdArgs) -> None:
        try:
            import ray
        except ImportError as e:
            raise ValueError("--afd-launcher ray needs Ray: pip install -e .[ray]") from e
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=True)
        self.afd = afd
        self.host = ray.util.get_node_ip_address()
        self.actors: dict[str, object] = {}
        self.tasks: dict[str, object] = {}

    def devices(self, afd: AfdArgs) -> list[str]:
        """From the cluster's GPUs, not this host's: each actor is given its own GPU as cuda:0."""
        gpus = int(self.ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            return ["cpu"] * afd.world_size
        if gpus < afd.world_size:
            raise ValueError(f"AFD needs {afd.world_size} GPUs in the Ray cluster, found {gpus}")
        return ["cuda:0"] * afd.world_size

    def _nodes(self, role: str) -> list[str]:
        given = self.afd.attn_nodes if role == ATTN else self.afd.expert_nodes
        if given:
            return [n.strip() for n in given.split(",") if n.strip()]
        alive = sorted(n["NodeManagerAddress"] for n in self.ray.nodes() if n["Alive"])
        return alive[:-1] or alive if role == ATTN else alive[-1:]

    def start(self, specs: list[WorkerSpec]) -> None:
        ray = self.ray

        @ray.remote
        class _Worker:
            def run(self, spec: WorkerSpec) -> None:
                worker_main(spec)

        for role in (ATTN, "expert"):
            nodes = self._nodes(role)
            for spec in (s for s in specs if s.role == role):
                node = nodes[spec.index % len(nodes)]  # a lane's TP ranks share its node
                gpus = 1 if spec.device.startswith("cuda") else 0
                actor = _Worker.options(num_gpus=gpus, resources={f"node:{node}": 0.001}).remote()
                self.actors[spec.name] = actor
                self.tasks[spec.name] = actor.run.remote(spec)

    def dead(self) -> list[str]:
        out = []
        for name, task in self.tasks.items():
            ready, _ = self.ray.wait([task], timeout=0)
            if ready:
                try:
                    self.ray.get(task)
                    out.append(f"worker {name} exited")
                except Exception as e:  # noqa: BLE001 - name the failure; its details (a traceback) go to the log
                    logger.error("AFD worker %s failed: %s", name, e)
                    out.append(f"worker {name} failed ({type(e).__name__})")
        return out

    def stop(self, timeout_s: float) -> None:
        self.ray.wait(list(self.tasks.values()), num_returns=len(self.tasks), timeout=timeout_s)
        for actor in self.actors.values():
            self.ray.kill(actor)


def make_launcher(afd: AfdArgs) -> Launcher:
    return RayLauncher(afd) if afd.launcher == "ray" else LocalLauncher()
