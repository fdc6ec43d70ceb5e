"""Give a model built on the meta device its storage on the real device, in the dtypes the weights
will be held in.

Built on meta first so no weight is ever allocated twice: a 122B FP8 model would not fit on one
GPU if its experts passed through bf16 even once. With an FP8 config on the GPU, the quantised
linear and expert weights are held as float8_e4m3fn plus block scales (the checkpoint's own bytes);
everything else, and every weight on the CPU (where the loader dequantises), in the model dtype.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.layers.linear import Linear
from minisgl.models.config import QuantConfig
from minisgl.moe.local_moe import ExpertWeights

# Linear layers the official FP8 checkpoints keep in BF16 (the router and the small gates).
_BF16_LINEARS = ("lm_head", "mlp.gate", "mlp.shared_expert_gate", "linear_attn.in_proj_a", "linear_attn.in_proj_b")
_HF_PREFIXES = ("model.language_model.", "model.")


def _local_name(name: str) -> str:
    for prefix in _HF_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def keeps_bf16(name: str, quant: QuantConfig) -> bool:
    """Whether the linear layer `name` (a model-local module name) is not FP8 in the checkpoint."""
    patterns = (*_BF16_LINEARS, *(_local_name(p) for p in quant.modules_to_not_convert))
    return any(name == p or name.endswith("." + p) for p in patterns)


def _hold_fp8(model: nn.Module, device: torch.device, quant: QuantConfig) -> None:
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and not keeps_bf16(name, quant):
            out_features, in_features = module.weight.shape
            parent, _, child = name.rpartition(".")
            with torch.device("meta"):  # allocated below with the rest, once layers are stacked
                fp8 = Fp8Linear(in_features, out_features, quant.block)
            if hasattr(module, "shards"):  # a TP rank's part of the checkpoint's weight (and so of its scales)
                fp8.shards = module.shards
            setattr(model.get_submodule(parent), child, fp8)
        elif isinstance(module, ExpertWeights):
            module.hold_fp8(quant.block, device)


def materialize(model: nn.Module, device: torch.device, fp8: QuantConfig | None) -> nn.Module:
    """Allocate (uninitialised) storage on `device` for every param still on meta; with `fp8`, the
    checkpoint's FP8 weights are held as FP8."""
    if fp8 is not None:
        _hold_fp8(model, device, fp8)
    for module in model.modules():  # layers that share an input, stacked for one GEMM (layers/row_stack.py)
        if hasattr(module, "stack_rows"):
            module.stack_rows(device)
    for module in model.modules():  # kernels that write their FP8 readers' codes (norms, the output gate)
        if hasattr(module, "feed_fp8_codes"):
            module.feed_fp8_codes()
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                setattr(module, pname, nn.Parameter(torch.empty_like(p, device=device), requires_grad=False))
    return model


def build_module(
    make: Callable[[], nn.Module], dtype: torch.dtype, device: torch.device, fp8: QuantConfig | None = None
) -> nn.Module:
    """Create a module's (uninitialised) params directly in `dtype` on `device` (FP8 ones in FP8 with
    `fp8`), with no copy: built on meta, then materialised."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            module = make()
    finally:
        torch.set_default_dtype(prev)
    return materialize(module, device, fp8)
