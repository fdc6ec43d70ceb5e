"""Torch references for the FP8 kernels, and a poisoned allocator for their outputs.

`emulated_*` reproduce the kernels' arithmetic: activations quantised per token in 128-groups
(quantize_block_fp8 with block (1, 128) is the same rule: scale amax / 448, 1 for an all-zero
group), weights dequantised, products in fp32. They differ from the kernels only in summation
order and the bf16 rounding of outputs, so they pin the kernels tightly. The plain references
(bf16 activations, dequantised weights) measure what FP8 activations cost.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernels.activations import Activations, tensor
from minisgl.layers.fp8 import dequantize_block_fp8, dequantize_gate_up, quantize_block_fp8
from minisgl.layers.linear import Linear
from minisgl.layers.row_stack import RowStack
from minisgl.models.config import QuantConfig
from minisgl.models.materialize import build_module, keeps_bf16
from minisgl.moe.local_moe import LocalMoE

DEVICE = "cuda"


def poison_allocator(nbytes: int = 1 << 30) -> None:
    """Leave NaN in the caching allocator's free memory, so a kernel output that comes from it and is
    not fully written shows NaN (the kernels allocate their outputs themselves)."""
    torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device=DEVICE)
    torch.cuda.synchronize()


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|; NaN anywhere fails every bound."""
    err = ((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    return float("inf") if x.isnan().any() else err


def quantize_acts(x: torch.Tensor) -> torch.Tensor:
    """x after the kernels' per-token, 128-group FP8 round trip, in fp32."""
    q, s = quantize_block_fp8(x.float(), (1, 128))
    return dequantize_block_fp8(q, s, (1, 128))


def emulated_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return quantize_acts(x) @ dequantize_block_fp8(w, s).T


def plain_linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x.float() @ dequantize_block_fp8(w, s).T


def moe_reference(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
    gate_up_scale: torch.Tensor | None, down_scale: torch.Tensor | None, emulate: bool,
) -> torch.Tensor:
    """fp32 loop over the hit experts. FP8 weights are dequantised; with `emulate` the activations
    go through the kernels' FP8 round trip before each GEMM."""
    act = quantize_acts if emulate else (lambda t: t.float())
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    hit = ids[(ids >= 0) & (ids < gate_up.shape[0])]
    for e in hit.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13, w2 = gate_up[e].float(), down[e].float()
        if gate_up_scale is not None:
            w13, w2 = dequantize_gate_up(gate_up[e], gate_up_scale[e]), dequantize_block_fp8(down[e], down_scale[e])
        g, u = (act(x[tok]) @ w13.T).chunk(2, dim=-1)
        h = (F.silu(g) * u).to(x.dtype)  # the kernel keeps h in the activation dtype between the GEMMs
        out.index_add_(0, tok, (act(h) @ w2.T) * weights[tok, slot, None].float())
    return out


class _FP8ActivationLinear(nn.Module):
    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.weight = linear.weight

    def forward(self, x: torch.Tensor | Activations) -> torch.Tensor:
        x = tensor(x)
        return F.linear(quantize_acts(x).to(x.dtype), self.weight)


class _FP8ActivationStack:
    def __init__(self, stack: RowStack) -> None:
        self.stack = stack

    def __call__(self, x: torch.Tensor | Activations) -> list[torch.Tensor]:
        x = tensor(x)
        return self.stack(quantize_acts(x).to(x.dtype))


class _FP8ActivationExperts:
    def forward(self, x, gate_up, down, ids, weights, shared=None, residual=None):  # noqa: ANN001, ANN201 - the experts interface
        x = tensor(x)
        out = moe_reference(x, gate_up, down, ids, weights, None, None, emulate=True).to(x.dtype)
        out = out if shared is None else shared.add_to(out)
        return out if residual is None else residual + out


def fp8_stacks(model: nn.Module, quant: QuantConfig) -> list[tuple[nn.Module, str]]:
    """(module, attribute) of every row stack (layers/row_stack.py) whose layers the checkpoint holds
    in FP8: the child Linears whose weights live in the stack's storage. A stack holds FP8 layers or
    BF16 ones, never both, as on the GPU."""
    found = []
    for name, module in model.named_modules():
        for attr, stack in vars(module).items():
            if not isinstance(stack, RowStack):
                continue
            storage = stack.weight.untyped_storage().data_ptr()
            held = [f"{name}.{child}" for child, layer in module.named_children()
                    if isinstance(layer, Linear) and layer.weight.untyped_storage().data_ptr() == storage]
            fp8 = {not keeps_bf16(layer, quant) for layer in held}
            assert len(held) == len(stack.rows) and len(fp8) == 1, f"{name}.{attr} holds {held}"
            if fp8 == {True}:
                found.append((module, attr))
    return found


def emulate_fp8_activations(model: nn.Module, quant: QuantConfig) -> None:
    """Make a dequantised (CPU) model round its activations the way the FP8 kernels do, before every
    linear layer the checkpoint holds in FP8, stacked or not, and before both expert GEMMs."""
    for module, attr in fp8_stacks(model, quant):
        setattr(module, attr, _FP8ActivationStack(getattr(module, attr)))
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and not keeps_bf16(name, quant):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, _FP8ActivationLinear(module))
        elif isinstance(module, LocalMoE):
            module.backend = _FP8ActivationExperts()


class _MoeLayer(nn.Module):
    """Names the block `mlp`, as in the model, so the router and shared gate stay BF16."""

    def __init__(self, hidden: int, experts: int, top_k: int, inter: int, shared_inter: int) -> None:
        super().__init__()
        from minisgl.moe.triton_experts import TritonExperts  # here: the module imports triton

        self.mlp = LocalMoE(hidden, experts, top_k, inter, shared_inter, True, TritonExperts())


def random_fp8_moe_block(hidden: int, experts: int, top_k: int, inter: int, shared_inter: int) -> LocalMoE:
    """A bf16 LocalMoE whose linears the FP8 checkpoint holds in FP8, built as the model builds it
    (row stacks included), with random codes, block scales and bf16 weights."""
    block = build_module(lambda: _MoeLayer(hidden, experts, top_k, inter, shared_inter), torch.bfloat16,
                         torch.device(DEVICE), QuantConfig("fp8", (128, 128))).mlp
    with torch.no_grad():
        for name, p in block.named_parameters():
            if p.dtype == torch.float8_e4m3fn:
                p.copy_(torch.randn(p.shape, device=DEVICE).to(torch.float8_e4m3fn))
            elif name.endswith("scale_inv"):
                p.copy_(torch.rand(p.shape, device=DEVICE).add(0.5) / (128 * p.shape[-1]) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, device=DEVICE) / p.shape[-1] ** 0.5)
    return block
