"""`--load-format dummy`: seeded random weights written straight into the model's params, on their
device and in their dtypes (FP8 weights as FP8 codes plus block scales), so real-shape runs need no
checkpoint.

Scale: every matrix gets std 1/sqrt(fan_in), so a unit-RMS input gives unit-RMS outputs. Each block
reads RMS-normalised input, so each residual add is O(1) and after L layers the residual stream is
about sqrt(2L) (~10 at 48 layers): finite in bf16 with room to spare. Router logits get std 1, so
routing spreads over the experts the way a trained router's does at a batch's scale. FP8 weights
hold N(0, 1) codes (e4m3 keeps ~2 significant bits of precision over that range) and a scale of
1/sqrt(fan_in) per block.

Each param draws from its own generator, seeded by the seed and its name, and each routed expert
from one seeded by its global index as well: an AFD attention worker (no routed experts) and an
expert worker (a slice of them) then hold exactly the colocated engine's values.
"""
from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from minisgl.layers.fp8 import FP8_DTYPE
from minisgl.layers.norm import GatedRMSNorm, RMSNorm
from minisgl.moe.local_moe import ExpertWeights

_CHUNK_ELEMENTS = 1 << 26  # random draws per kernel: bounds the temporary at 128 MiB of bf16


def _fill_normal(p: torch.Tensor, std: float, mean: float, gen: torch.Generator) -> None:
    """p = mean + std * N(0, 1), drawn in chunks along dim 0 (FP8 params take the codes directly)."""
    rows = max(1, _CHUNK_ELEMENTS // p[0].numel())
    draw = torch.bfloat16 if p.dtype == FP8_DTYPE else p.dtype
    for r0 in range(0, p.shape[0], rows):
        part = p[r0 : r0 + rows]
        sample = torch.randn(part.shape, generator=gen, device=p.device, dtype=draw)
        part.copy_(sample.mul_(std).add_(mean))


def _init_param(module: nn.Module, name: str, p: torch.Tensor, gen: torch.Generator) -> None:
    if p.dtype == FP8_DTYPE:  # its block scales are set once per param, by the caller
        _fill_normal(p, 1.0, 0.0, gen)
    elif name == "A_log":  # GDN decay rates A in [1, 16), as trained models have them
        p.copy_(torch.rand(p.shape, generator=gen, device=p.device).mul(15).add(1).log())
    elif p.dim() == 1:  # norm weights: 1 + w norms near w = 0, plain w ones near 1; dt_bias near 0
        plain_norm = isinstance(module, GatedRMSNorm) or (isinstance(module, RMSNorm) and not module.zero_centered)
        _fill_normal(p, 0.02, 1.0 if plain_norm else 0.0, gen)
    else:
        _fill_normal(p, 1.0 / math.sqrt(p.shape[-1]), 0.0, gen)


def _generator(seed: int, key: str, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed((seed * 0x9E3779B1 + zlib.crc32(key.encode())) % (1 << 63))


def init_dummy_weights(model: nn.Module, seed: int) -> None:
    """Fill every param of `model` (already on its device) with seeded random values."""
    device = next(model.parameters()).device
    with torch.no_grad():
        for prefix, module in model.named_modules():
            for name, p in module.named_parameters(recurse=False):
                if name.endswith("_scale_inv"):  # set with its FP8 weight
                    continue
                key = f"{prefix}.{name}"
                if isinstance(module, ExpertWeights):  # [count, ...]: one draw per global expert id
                    for e in range(module.count):
                        gen = _generator(seed, f"{key}[{module.start + e}]", device)
                        _init_param(module, name, p.data[e : e + 1], gen)
                else:
                    _init_param(module, name, p.data, _generator(seed, key, device))
                if p.dtype == FP8_DTYPE:
                    getattr(module, name + "_scale_inv").data.fill_(1.0 / math.sqrt(p.shape[-1]))
