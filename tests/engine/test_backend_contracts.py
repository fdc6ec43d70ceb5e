"""Every registered backend keeps its family's Protocol (attention/, gdn/, moe/ backend.py),
cuda_graph_safe included, so the engine never has to probe a backend for what it can do."""
from __future__ import annotations

import pytest

from minisgl.attention.backend import AttentionBackend
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.engine.plan import BackendNames
from minisgl.gdn.backend import GDNBackend
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.moe.backend import ExpertsBackend
from minisgl.moe.registry import MOE_BACKENDS
from minisgl.registry import Registry

FAMILIES: list[tuple[Registry, type]] = [
    (ATTENTION_BACKENDS, AttentionBackend), (GDN_BACKENDS, GDNBackend), (MOE_BACKENDS, ExpertsBackend)]
GPU_ONLY = {"triton", "fla"}  # import triton (and fla), which CPU machines do not have


def _check(registry: Registry, protocol: type, name: str) -> None:
    cls = registry.get(name)
    assert isinstance(getattr(cls, "cuda_graph_safe", None), bool), (
        f"{registry.family} backend {name!r} does not say whether it is CUDA-graph safe")
    assert isinstance(cls(), protocol), f"{registry.family} backend {name!r} does not keep {protocol.__name__}"


@pytest.mark.parametrize("registry,protocol", FAMILIES, ids=lambda f: getattr(f, "family", ""))
def test_cpu_backends_keep_their_contract(registry: Registry, protocol: type) -> None:
    names = [n for n in registry.names() if n not in GPU_ONLY]
    assert names, f"no CPU backend registered for {registry.family}"
    for name in names:
        _check(registry, protocol, name)


@pytest.mark.gpu
@pytest.mark.parametrize("registry,protocol", FAMILIES, ids=lambda f: getattr(f, "family", ""))
def test_every_backend_keeps_its_contract(registry: Registry, protocol: type) -> None:
    for name in registry.names():
        _check(registry, protocol, name)


def test_a_backend_without_the_flag_breaks_the_contract() -> None:
    class NoFlag:
        def forward(self, *args: object) -> None: ...

    assert not isinstance(NoFlag(), AttentionBackend)


def test_the_torch_references_are_not_captured_in_graphs() -> None:
    """Both loop on the host over per-step lengths or routed experts; the GDN reference does not."""
    backends = BackendNames("torch", "torch", "torch").build()
    assert backends.graph_unsafe() == ["TorchAttentionBackend", "TorchExperts"]
