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
GPU_ONLY = {"triton", "fla", "deep_gemm"}  # import triton (and fla), which CPU machines do not have


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
        if name == "deep_gemm" and deep_gemm_unavailable() is not None:
            continue  # test_deep_gemm_keeps_the_contract says why it cannot run
        _check(registry, protocol, name)


def deep_gemm_unavailable() -> str | None:
    import torch

    from minisgl.kernels.moe_deep_gemm import unavailable_reason

    return unavailable_reason(torch.device("cuda"))


@pytest.mark.gpu
def test_deep_gemm_keeps_the_contract() -> None:
    reason = deep_gemm_unavailable()
    if reason is not None:
        pytest.skip(reason)
    _check(MOE_BACKENDS, ExpertsBackend, "deep_gemm")


def test_deep_gemm_refuses_to_build_where_it_cannot_run() -> None:
    """Chosen without the package, off Hopper or on the CPU, it is a start-up error naming the flag
    and the reason, not a silent fall back to the Triton kernels."""
    pytest.importorskip("triton")
    import torch

    from minisgl.kernels.moe_deep_gemm import unavailable_reason
    from minisgl.moe.deep_gemm_experts import DeepGemmExperts

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    reason = unavailable_reason(device)
    if reason is None:
        pytest.skip("DeepGEMM runs here")
    with pytest.raises(RuntimeError, match=f"--moe-backend deep_gemm: {reason}"):
        DeepGemmExperts()


def test_a_backend_without_the_flag_breaks_the_contract() -> None:
    class NoFlag:
        def forward(self, *args: object) -> None: ...

    assert not isinstance(NoFlag(), AttentionBackend)


def test_the_torch_references_are_not_captured_in_graphs() -> None:
    """Both loop on the host over per-step lengths or routed experts; the GDN reference does not."""
    backends = BackendNames("torch", "torch", "torch").build()
    assert backends.graph_unsafe() == ["TorchAttentionBackend", "TorchExperts"]
