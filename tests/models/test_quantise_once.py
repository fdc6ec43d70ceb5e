"""kernels/activations.py on the CPU: an Activations is quantised on its first FP8 use only, BF16
layers read the tensor itself, and the model hands each projection input to all its readers as one
Activations, so a forward quantises each distinct input once. The quantiser is replaced by a counting
torch stand-in (CPU installs have no triton); GPU bit-equality is tests/gpu/test_quantise_once_gpu.py."""
from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu.fp8_refs import fp8_stacks
from minisgl import LLM
from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
from minisgl.kernels.activations import Activations, tensor
from minisgl.layers.fp8 import quantize_block_fp8
from minisgl.layers.linear import Linear
from minisgl.layers.row_stack import RowStack
from minisgl.models.materialize import keeps_bf16
from minisgl.moe.local_moe import LocalMoE

CPU = dict(device="cpu", page_size=16, context_length=512, max_running_requests=8)


@pytest.fixture
def quantised(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The inputs the quantiser saw, in call order (kept alive, so data pointers stay distinct)."""
    seen: list[torch.Tensor] = []

    def quantize_activations(x: torch.Tensor, rows_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        assert rows_multiple == ROWS_MULTIPLE  # padded for cuBLAS whichever GEMM reads it
        seen.append(x)
        return quantize_block_fp8(x.float(), (1, 128))

    fake = types.ModuleType("minisgl.kernels.fp8_quant")
    fake.quantize_activations = quantize_activations
    monkeypatch.setitem(sys.modules, "minisgl.kernels.fp8_quant", fake)
    return seen


def test_quantised_on_first_use_only(quantised: list[torch.Tensor]) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 256)
    acts = Activations(x)
    assert not quantised  # nothing until an FP8 layer asks
    first = acts.fp8()
    assert acts.fp8() is first and len(quantised) == 1
    assert quantised[0].shape == (6, 256)  # tokens as rows
    assert Activations.of(acts) is acts and tensor(acts) is x and tensor(x) is x
    linear = Linear(256, 8)
    linear.weight.data = torch.randn(8, 256)
    assert torch.equal(linear(acts), linear(x)) and len(quantised) == 1  # BF16 layers never quantise


class _CountingFp8(nn.Module):
    """A linear the FP8 checkpoint holds in FP8: asks for its input's codes as Fp8Linear does."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.weight = linear.weight

    def forward(self, x: torch.Tensor | Activations) -> torch.Tensor:
        Activations.of(x).fp8()
        return F.linear(tensor(x), self.weight)


class _CountingExperts:
    """Routed experts that ask for their input's codes as TritonExperts' gate_up does."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def forward(self, x, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201 - the experts interface
        Activations.of(x).fp8()
        return self.inner.forward(tensor(x), *args, **kwargs)


class _CountingStack:
    """A row stack (layers/row_stack.py) holding a layer the checkpoint keeps in FP8: asks for its
    input's codes as the stacked FP8 GEMM does."""

    def __init__(self, stack: RowStack) -> None:
        self.stack = stack

    def __call__(self, x: torch.Tensor | Activations) -> list[torch.Tensor]:
        Activations.of(x).fp8()
        return self.stack(tensor(x))


def test_each_input_is_quantised_once_per_forward(tiny_checkpoints: dict[str, str], quantised: list[torch.Tensor]) -> None:
    engine = LLM(tiny_checkpoints["fp8"], dtype="float32", **CPU).engine
    model, quant = engine.model, engine.config.quant
    for module, attr in fp8_stacks(model, quant):
        setattr(module, attr, _CountingStack(getattr(module, attr)))
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and not keeps_bf16(name, quant):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, _CountingFp8(module))
        elif isinstance(module, LocalMoE):
            module.backend = _CountingExperts(module.backend)
    seq = list(range(3, 40))
    slot = engine.pool.allocate(len(seq))
    engine.pool.ensure_tokens(slot, len(seq))
    engine.forward_batch(engine.make_batch([seq], [0], [slot]))
    engine.pool.free(slot)
    layers = model.layers
    assert all(layer.mlp.shared_expert is not None for layer in layers)
    # Per layer: the mixer's input (GDN qkv and z, or attention q, k and v), its output projection's,
    # the MoE block's (shared gate and up, routed gate_up), the shared down projection's.
    assert len(quantised) == 4 * len(layers)
    assert len({t.data_ptr() for t in quantised}) == len(quantised), "an input was quantised twice"
