"""Streaming, strict safetensors loader for the real Qwen3.5 / Qwen3 checkpoint layouts.

- prefixes `model.language_model.` (ForConditionalGeneration) and `model.` (ForCausalLM);
- `model.visual.*` and `mtp.*` are skipped;
- routed experts per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`) or fused
  (`mlp.experts.gate_up_proj` / `down_proj`), both into the fused [E, 2I, H] / [E, H, I] params;
- FP8 block checkpoints: `X.weight` (float8_e4m3fn) + `X.weight_scale_inv`, copied as they are
  into params held in FP8 (models/materialize.py, on the GPU), dequantised into any other param;
- a role filter so a worker loads only its share (an attention worker no routed experts, an
  expert worker only its experts);
- strict: a missing, unexpected, duplicated or mis-shaped tensor is an error naming it.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterator

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from minisgl.layers.fp8 import FP8_DTYPE, dequantize_block_fp8, quantize_block_fp8, quantize_gate_up
from minisgl.models.config import ModelConfig

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


def iter_checkpoint(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (on-disk name, tensor) one tensor at a time, with a progress bar."""
    paths = checkpoint_files(model_dir)
    total = 0
    for p in paths:
        with safe_open(p, framework="pt") as f:
            total += len(f.keys())
    with tqdm(total=total, desc="Loading weights", unit="tensor") as bar:
        for p in paths:
            with safe_open(p, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
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
    slice of the tensor that belongs to this worker (fused experts)."""

    param: str
    view: torch.Tensor
    units: tuple[object, ...]
    source: slice | None = None
    scale: torch.Tensor | None = None  # the matching view of the param's block scales, if held in FP8


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
                start = self._expert_start(name)
                kinds = ("gate", "up") if m.group(2) == "gate_up_proj" else ("down",)
                self.expected[name] = {(k, start + e) for e in range(p.shape[0]) for k in kinds}
            else:
                self.expected[name] = {"all"}
        self.loaded: dict[str, set[object]] = {n: set() for n in self.expected}
        self.pending_fp8: dict[str, tuple[str, torch.Tensor]] = {}
        self.pending_scale: dict[str, torch.Tensor] = {}
        q = config.quant
        self.no_convert = set(q.modules_to_not_convert) if q else set()

    def _expert_start(self, param: str) -> int:
        owner = param.rsplit(".", 1)[0]
        return int(getattr(self.modules[owner], "start", 0))

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
            e = expert - self._expert_start(param)
            inter = self.config.moe_intermediate_size
            view = {"gate": p[e, :inter], "up": p[e, inter:], "down": p[e]}[kind]
            scale = self._scale(param)
            if scale is not None:  # gate_up's scale rows: gate's blocks, then up's
                half = scale.shape[1] // 2
                scale = {"gate": scale[e, :half], "up": scale[e, half:], "down": scale[e]}[kind]
            return _Target(param, view, ((kind, expert),), scale=scale)
        m = _FUSED_EXPERT.match(local)
        if m:
            if not self.wf.routed_experts:
                return None
            self.fused_layout = True
            param = f"layers.{m.group(1)}.mlp.experts.{m.group(2)}"
            p = self._param(param, orig)
            start = self._expert_start(param)
            kinds = ("gate", "up") if m.group(2) == "gate_up_proj" else ("down",)
            units = tuple((k, start + e) for e in range(p.shape[0]) for k in kinds)
            return _Target(param, p, units, slice(start, start + p.shape[0]), self._scale(param))
        if ".mlp.experts." in local:
            raise WeightError(f"unexpected tensor {orig!r}: unknown routed-expert layout")
        if not self.wf.non_expert:
            return None
        return _Target(local, self._param(local, orig), ("all",), scale=self._scale(local))

    def _scale(self, param: str) -> torch.Tensor | None:
        scale = self.params.get(param + _SCALE_SUFFIX)
        return None if scale is None else scale.data

    def _param(self, name: str, orig: str) -> torch.Tensor:
        if name not in self.params:
            raise WeightError(f"unexpected tensor {orig!r}: the model has no parameter {name!r}")
        return self.params[name].data

    # -- assignment -----------------------------------------------------------------------------
    def add(self, orig: str, tensor: torch.Tensor) -> None:
        split = _strip_prefix(orig)
        if split is None:
            return
        prefix, local = split
        if prefix:
            self.prefix = prefix
        if local.endswith(".weight" + _SCALE_SUFFIX):
            base = local[: -len(_SCALE_SUFFIX)]
            if base in self.pending_fp8:
                self._place(*self.pending_fp8.pop(base), scale=tensor)
            else:
                self.pending_scale[base] = tensor
            return
        if tensor.dtype == torch.float8_e4m3fn:
            module = orig.rsplit(".", 1)[0]
            if module in self.no_convert:
                raise WeightError(f"tensor {orig!r} is fp8 but its module is listed in modules_to_not_convert")
            if local in self.pending_scale:
                self._place(orig, tensor, scale=self.pending_scale.pop(local))
            else:
                self.pending_fp8[local] = (orig, tensor)
            return
        self._place(orig, tensor, scale=None)

    def _place(self, orig: str, tensor: torch.Tensor, scale: torch.Tensor | None) -> None:
        local = _strip_prefix(orig)[1]
        t = self.target(local, orig)
        if t is None:
            return
        q = self.config.quant
        if scale is not None and q is None:
            raise WeightError(f"tensor {orig!r} is fp8 but config.json has no fp8 quantization_config")
        held_fp8 = t.view.dtype == FP8_DTYPE
        if scale is not None and not held_fp8:
            tensor = dequantize_block_fp8(tensor, scale, q.block, torch.float32)
        elif held_fp8 and scale is None:  # a BF16 tensor for a weight held in FP8: quantise it on the device
            fused_gate_up = t.source is not None and t.param.endswith("gate_up_proj")
            tensor, scale = (quantize_gate_up if fused_gate_up else quantize_block_fp8)(tensor.to(t.view.device), q.block)
        src = tensor if t.source is None else tensor[t.source]
        if tuple(src.shape) != tuple(t.view.shape):
            raise WeightError(
                f"tensor {orig!r} has shape {tuple(tensor.shape)}, expected {tuple(t.view.shape)}"
                + (" (after taking this worker's experts)" if t.source is not None else "")
            )
        if self.loaded[t.param].intersection(t.units):
            raise WeightError(f"tensor {orig!r} is given twice")
        if held_fp8:
            scale_src = scale if t.source is None else scale[t.source]
            if tuple(scale_src.shape) != tuple(t.scale.shape):
                raise WeightError(
                    f"scale of {orig!r} has shape {tuple(scale.shape)}, expected {tuple(t.scale.shape)} "
                    f"(one per {q.block[0]}x{q.block[1]} block)"
                )
            t.scale.copy_(scale_src)
        self.loaded[t.param].update(t.units)
        t.view.copy_(src.to(t.view.dtype))

    def finish(self) -> None:
        for base, (orig, _) in self.pending_fp8.items():
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
    loader = _Loader(model, config, wf or WeightFilter())
    with torch.no_grad():
        for name, tensor in iter_checkpoint(model_dir):
            loader.add(name, tensor)
    loader.finish()
