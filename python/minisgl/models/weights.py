"""Streaming, strict safetensors loader for the real Qwen3.5 / Qwen3 checkpoint layouts.

- prefixes `model.language_model.` (ForConditionalGeneration) and `model.` (ForCausalLM);
- `model.visual.*` and `mtp.*` are skipped;
- routed experts per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`) or fused
  (`mlp.experts.gate_up_proj` / `down_proj`), both into the fused [E, 2I, H] / [E, H, I] params;
- FP8 block checkpoints: `X.weight` (float8_e4m3fn) + `X.weight_scale_inv`, copied as they are
  into params held in FP8 (models/materialize.py, on the GPU), dequantised into any other param;
- a role filter so a worker loads only its share (an attention worker no routed experts, an
  expert worker only its experts);
- tensor and expert parallelism: a rank reads from disk only its part of each tensor (the
  `shards` its modules declare, its experts and their intermediate slice), FP8 block scales
  with it, on block boundaries;
- strict: a missing, unexpected, duplicated or mis-shaped tensor is an error naming it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from safetensors import safe_open
from torch import nn

from minisgl.layers.fp8 import FP8_DTYPE, dequantize_block_fp8, quantize_block_fp8, quantize_gate_up
from minisgl.models.config import ModelConfig
from minisgl.moe.local_moe import ExpertWeights
from minisgl.parallel.shard import Shard
from minisgl.process_setup import loading_bar

_PREFIXES = ("model.language_model.", "model.")
_SKIPPED = ("model.visual.", "visual.", "mtp.", "model.mtp.")
_PER_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_FUSED_EXPERT = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_SCALE_SUFFIX = "_scale_inv"


class WeightError(ValueError):
    """A checkpoint that does not match the model, naming the offending tensor."""


@dataclass(frozen=True)
class WeightFilter:
    """Which checkpoint tensors this process loads."""

    non_expert: bool = True
    routed_experts: bool = True
    expert_range: tuple[int, int] | None = None  # [start, end) of the routed experts to load

    @staticmethod
    def attention_worker() -> "WeightFilter":
        return WeightFilter(routed_experts=False)

    @staticmethod
    def expert_worker(start: int, end: int) -> "WeightFilter":
        return WeightFilter(non_expert=False, expert_range=(start, end))

    def wants_expert(self, expert: int) -> bool:
        if not self.routed_experts:
            return False
        return self.expert_range is None or self.expert_range[0] <= expert < self.expert_range[1]


def checkpoint_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise WeightError(f"{model_dir!r} has no *.safetensors files")
    paths = [os.path.join(model_dir, f) for f in files]
    for p in paths:
        if not os.path.exists(p):
            raise WeightError(f"checkpoint shard {p!r} named in the index does not exist")
    return paths


class DiskTensor:
    """One checkpoint tensor, read lazily: a rank reads only its shard's bytes."""

    def __init__(self, handle: Any, name: str) -> None:
        self._handle, self._name = handle, name
        self._slice = handle.get_slice(name)
        self.shape = tuple(self._slice.get_shape())
        self.is_fp8 = self._slice.get_dtype() == "F8_E4M3"

    def read(self, shard: Shard | None = None) -> torch.Tensor:
        return self._handle.get_tensor(self._name) if shard is None else shard.read(self._slice)


def iter_checkpoint(model_dir: str) -> Iterator[tuple[str, DiskTensor]]:
    """Yields (on-disk name, lazy tensor) one tensor at a time, with a progress bar; each must be
    read before the next is asked for (its file closes after its last tensor)."""
    paths = checkpoint_files(model_dir)
    total = 0
    for p in paths:
        with safe_open(p, framework="pt") as f:
            total += len(f.keys())
    with loading_bar(total, "tensor") as bar:
        for p in paths:
            with safe_open(p, framework="pt") as f:
                for name in f.keys():
                    yield name, DiskTensor(f, name)
                    bar.update()


def _strip_prefix(name: str) -> tuple[str, str] | None:
    """(prefix, local name), or None for a tensor minisgl does not use."""
    if name.startswith(_SKIPPED):
        return None
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix) :]
    return "", name  # root tensors such as lm_head.weight


@dataclass(frozen=True)
class _Target:
    """Where one checkpoint tensor lands: a view of a param, the coverage units it fills, and the
    part of the on-disk tensor that belongs to this rank (None: all of it)."""

    param: str
    view: torch.Tensor
    units: tuple[object, ...]
    shard: Shard | None = None
    scale: torch.Tensor | None = None  # the matching view of the param's block scales, if held in FP8
    fused_gate_up: bool = False  # the view holds [gate | up] halves, quantised as separate matrices

    def full_shape(self) -> tuple[int, ...]:
        return self.shard.full_shape if self.shard is not None else tuple(self.view.shape)


def _expert_shard(full: tuple[int, ...], experts: tuple[int, int] | None, inter_dim: int,
                  inter: tuple[tuple[int, int], ...]) -> Shard | None:
    """An expert tensor's shard: a range of experts along dim 0 (fused layouts) and this rank's
    intermediate rows or columns along `inter_dim` (TP-split experts)."""
    cuts = ([(0, (experts,))] if experts is not None else []) + ([(inter_dim, inter)] if inter else [])
    return Shard(full, tuple(cuts)) if cuts else None


class _Loader:
    def __init__(self, model: nn.Module, config: ModelConfig, wf: WeightFilter) -> None:
        self.params = dict(model.named_parameters())
        self.modules = dict(model.named_modules())
        self.config = config
        self.wf = wf
        self.prefix = "model."
        self.fused_layout = False
        self.expected: dict[str, set[object]] = {}
        for name, p in self.params.items():
            if name.endswith(_SCALE_SUFFIX):
                continue  # block scales arrive with (and are checked with) their FP8 weight
            m = re.match(r"^(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$", name)
            if m:
                start = self._experts(name).start
                kinds = ("gate", "up") if m.group(2) == "gate_up_proj" else ("down",)
                self.expected[name] = {(k, start + e) for e in range(p.shape[0]) for k in kinds}
            else:
                self.expected[name] = {"all"}
        self.loaded: dict[str, set[object]] = {n: set() for n in self.expected}
        self.pending_fp8: dict[str, tuple[str, _Target, torch.Tensor]] = {}
        self.pending_scale: dict[str, torch.Tensor] = {}
        q = config.quant
        self.no_convert = set(q.modules_to_not_convert) if q else set()

    def _experts(self, param: str) -> ExpertWeights:
        return self.modules[param.rsplit(".", 1)[0]]

    # -- routing of one tensor ------------------------------------------------------------------
    def target(self, local: str, orig: str) -> _Target | None:
        m = _PER_EXPERT.match(local)
        if m:
            layer, expert, kind = int(m.group(1)), int(m.group(2)), m.group(3)
            if not self.wf.wants_expert(expert):
                return None
            if expert >= self.config.num_experts:
                raise WeightError(f"unexpected tensor {orig!r}: expert {expert} >= num_experts")
            param = f"layers.{layer}.mlp.experts." + ("down_proj" if kind == "down" else "gate_up_proj")
            p = self._param(param, orig)
            ew = self._experts(param)
            e = expert - ew.start
            if not 0 <= e < ew.count:
                return None  # another expert-parallel rank's expert
            hidden, full_inter = self.config.hidden_size, ew.intermediate
            inter = () if ew.inter_range == (0, full_inter) else (ew.inter_range,)
            local_inter = p.shape[1] // 2 if kind != "down" else p.shape[2]
            view = {"gate": p[e, :local_inter], "up": p[e, local_inter:], "down": p[e]}[kind]
            full = (hidden, full_inter) if kind == "down" else (full_inter, hidden)
            shard = _expert_shard(full, None, 1 if kind == "down" else 0, inter)
            scale = self._scale(param)
            if scale is not None:  # gate_up's scale rows: gate's blocks, then up's
                half = scale.shape[1] // 2
                scale = {"gate": scale[e, :half], "up": scale[e, half:], "down": scale[e]}[kind]
            return _Target(param, view, ((kind, expert),), shard, scale)
        m = _FUSED_EXPERT.match(local)
        if m:
            if not self.wf.routed_experts:
                return None
            self.fused_layout = True
            param = f"layers.{m.group(1)}.mlp.experts.{m.group(2)}"
            p = self._param(param, orig)
            ew = self._experts(param)
            n_exp, hidden, (i0, i1), full_inter = self.config.num_experts, self.config.hidden_size, ew.inter_range, ew.intermediate
            experts = None if ew.count == n_exp else (ew.start, ew.start + ew.count)
            split = (i0, i1) != (0, full_inter)
            gate_up = m.group(2) == "gate_up_proj"
            if gate_up:
                shard = _expert_shard((n_exp, 2 * full_inter, hidden), experts, 1,
                                      ((i0, i1), (full_inter + i0, full_inter + i1)) if split else ())
            else:
                shard = _expert_shard((n_exp, hidden, full_inter), experts, 2, ((i0, i1),) if split else ())
            kinds = ("gate", "up") if gate_up else ("down",)
            units = tuple((k, ew.start + e) for e in range(p.shape[0]) for k in kinds)
            return _Target(param, p, units, shard, self._scale(param), fused_gate_up=gate_up)
        if ".mlp.experts." in local:
            raise WeightError(f"unexpected tensor {orig!r}: unknown routed-expert layout")
        if not self.wf.non_expert:
            return None
        owner, _, pname = local.rpartition(".")
        module = self.modules.get(owner)
        shard = getattr(module, "shards", {}).get(pname) if module is not None else None
        return _Target(local, self._param(local, orig), ("all",), shard, self._scale(local))

    def _scale(self, param: str) -> torch.Tensor | None:
        scale = self.params.get(param + _SCALE_SUFFIX)
        return None if scale is None else scale.data

    def _param(self, name: str, orig: str) -> torch.Tensor:
        if name not in self.params:
            raise WeightError(f"unexpected tensor {orig!r}: the model has no parameter {name!r}")
        return self.params[name].data

    # -- reading --------------------------------------------------------------------------------
    def _read(self, orig: str, source: DiskTensor, t: _Target) -> torch.Tensor:
        full = t.full_shape()
        if source.shape != full:
            raise WeightError(
                f"tensor {orig!r} has shape {source.shape}, expected {full}"
                + (" (whole, before taking this rank's part)" if t.shard is not None else "")
            )
        return source.read(t.shard)

    def _read_scale(self, orig: str, source: DiskTensor, t: _Target) -> torch.Tensor:
        q = self.config.quant
        if q is None:
            raise WeightError(f"tensor {orig!r} is an fp8 scale but config.json has no fp8 quantization_config")
        if t.shard is None:
            return source.read()
        try:
            shard = t.shard.block_scales(q.block)
        except ValueError as e:
            raise WeightError(f"{orig!r}: this rank's part {e}; choose a TP size that keeps whole blocks") from None
        if source.shape != shard.full_shape:
            raise WeightError(f"scale {orig!r} has shape {source.shape}, expected {shard.full_shape}")
        return source.read(shard)

    # -- assignment -----------------------------------------------------------------------------
    def add(self, orig: str, source: DiskTensor) -> None:
        split = _strip_prefix(orig)
        if split is None:
            return
        prefix, local = split
        if prefix:
            self.prefix = prefix
        if local.endswith(".weight" + _SCALE_SUFFIX):
            base = local[: -len(_SCALE_SUFFIX)]
            t = self.target(base, orig[: -len(_SCALE_SUFFIX)])
            if t is None:
                return
            scale = self._read_scale(orig, source, t)
            if base in self.pending_fp8:
                self._place(*self.pending_fp8.pop(base), scale=scale)
            else:
                self.pending_scale[base] = scale
            return
        if source.is_fp8:
            module = orig.rsplit(".", 1)[0]
            if module in self.no_convert:
                raise WeightError(f"tensor {orig!r} is fp8 but its module is listed in modules_to_not_convert")
        t = self.target(local, orig)
        if t is None:
            return
        tensor = self._read(orig, source, t)
        if not source.is_fp8:
            self._place(orig, t, tensor, scale=None)
        elif local in self.pending_scale:
            self._place(orig, t, tensor, scale=self.pending_scale.pop(local))
        else:
            self.pending_fp8[local] = (orig, t, tensor)

    def _place(self, orig: str, t: _Target, tensor: torch.Tensor, scale: torch.Tensor | None) -> None:
        q = self.config.quant
        if scale is not None and q is None:
            raise WeightError(f"tensor {orig!r} is fp8 but config.json has no fp8 quantization_config")
        held_fp8 = t.view.dtype == FP8_DTYPE
        if scale is not None and not held_fp8:
            tensor = dequantize_block_fp8(tensor, scale, q.block, torch.float32)
        elif held_fp8 and scale is None:  # a BF16 tensor for a weight held in FP8: quantise it on the device
            tensor, scale = (quantize_gate_up if t.fused_gate_up else quantize_block_fp8)(tensor.to(t.view.device), q.block)
        if tuple(tensor.shape) != tuple(t.view.shape):  # the whole tensor matched: a model/shard mismatch
            raise WeightError(f"tensor {orig!r} gives this rank shape {tuple(tensor.shape)}, expected {tuple(t.view.shape)}")
        if self.loaded[t.param].intersection(t.units):
            raise WeightError(f"tensor {orig!r} is given twice")
        if held_fp8:
            if tuple(scale.shape) != tuple(t.scale.shape):
                raise WeightError(
                    f"scale of {orig!r} has shape {tuple(scale.shape)}, expected {tuple(t.scale.shape)} "
                    f"(one per {q.block[0]}x{q.block[1]} block)"
                )
            t.scale.copy_(scale)
        self.loaded[t.param].update(t.units)
        t.view.copy_(tensor.to(t.view.dtype))

    def finish(self) -> None:
        for base, (orig, _, _) in self.pending_fp8.items():
            raise WeightError(f"fp8 tensor {orig!r} has no {base + _SCALE_SUFFIX!r}")
        for base in self.pending_scale:
            raise WeightError(f"scale {self.prefix + base + _SCALE_SUFFIX!r} has no fp8 weight {base!r}")
        for name, units in self.expected.items():
            missing = units - self.loaded[name]
            if missing:
                raise WeightError(f"checkpoint is missing tensor {self._disk_name(name, sorted(missing, key=str)[0])!r}")

    def _disk_name(self, param: str, unit: object) -> str:
        if param == "lm_head.weight":
            return param
        if isinstance(unit, tuple) and not self.fused_layout:
            kind, expert = unit
            layer = param.split(".")[1]
            return f"{self.prefix}layers.{layer}.mlp.experts.{expert}.{kind}_proj.weight"
        return self.prefix + param


def load_weights(model: nn.Module, model_dir: str, config: ModelConfig, wf: WeightFilter | None = None) -> None:
    """Fill `model`'s params from the checkpoint, reading of each tensor only the part this rank
    holds (the `shards` of its modules, the expert range and intermediate slice of its experts)."""
    loader = _Loader(model, config, wf or WeightFilter())
    with torch.no_grad():
        for name, source in iter_checkpoint(model_dir):
            loader.add(name, source)
    loader.finish()
