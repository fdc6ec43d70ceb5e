"""The engine plan: the flags (EngineArgs) resolved once into the facts every process builds from.

resolve_plan(args) reads the model's config and settles the model path (the embedded tiny model
without --model-path), the device, the dtype, the longest sequence, the pool's sizes from the
flags, whether a GPU re-sizes the pool from measured memory, whether decode runs in CUDA graphs,
and each backend family's concrete name. The colocated engine, its TP followers, the AFD
coordinator and workers, and the benchmarks take a plan; none of them derives these again.
A process placed on another device (a TP follower, an AFD worker) takes `plan.on_device(dev)`.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace

import torch

from minisgl.attention.backend import AttentionBackend
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.engine.args import CPU_MAX_RUNNING_REQUESTS, KV_CACHE_DTYPES, EngineArgs
from minisgl.gdn.backend import GDNBackend
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.kvcache.hybrid_pool import PoolConfig, PoolLayout
from minisgl.kvcache.planner import cache_slots_for, slot_split
from minisgl.models.config import ModelConfig, QuantConfig, load_config
from minisgl.models.context import Backends
from minisgl.models.sharding import pool_layout
from minisgl.models.tiny.default import default_model_path
from minisgl.moe.backend import ExpertsBackend
from minisgl.moe.registry import MOE_BACKENDS
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.registry import Registry

_REGISTRIES: dict[str, Registry] = {"attention": ATTENTION_BACKENDS, "gdn": GDN_BACKENDS, "moe": MOE_BACKENDS}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _auto_backend(family: str, device: torch.device) -> str:
    """The default backend of a family on this device: the torch references on the CPU, our
    kernels on CUDA (fla's chunked prefill for GDN when it is installed)."""
    if device.type != "cuda":
        return "torch"
    if family == "gdn":
        return "fla" if importlib.util.find_spec("fla") is not None else "triton"
    return "triton" if "triton" in _REGISTRIES[family].names() else "torch"


@dataclass(frozen=True)
class BackendNames:
    """The registered name of each backend family's choice ("auto" already resolved)."""

    attention: str
    gdn: str
    moe: str

    @classmethod
    def resolve(cls, attention: str, gdn: str, moe: str, device: torch.device) -> "BackendNames":
        """"auto" becomes the family's default on `device`; a name no backend has is an error now."""
        names = {"attention": attention, "gdn": gdn, "moe": moe}
        resolved = {f: _auto_backend(f, device) if n == "auto" else n for f, n in names.items()}
        for family, name in resolved.items():
            _REGISTRIES[family].check(name)
        return cls(**resolved)

    def build_one(self, family: str) -> AttentionBackend | GDNBackend | ExpertsBackend:
        """A fresh backend object of one family (an expert worker needs only the MoE one)."""
        return _REGISTRIES[family].get(getattr(self, family))()

    def build(self) -> Backends:
        """Fresh backend objects (they may hold per-process state, such as a step's cached inputs)."""
        return Backends(*(self.build_one(f) for f in ("attention", "gdn", "moe")))


def fp8_storage(config: ModelConfig, device: torch.device) -> QuantConfig | None:
    """The FP8 layout to hold weights in: the checkpoint's on the GPU; none on the CPU, where the
    loader dequantises (the torch references compute in the model dtype)."""
    return config.quant if device.type == "cuda" else None


@dataclass(frozen=True)
class EnginePlan:
    args: EngineArgs  # as given, but model_path filled in and device the resolved one
    config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    backends: BackendNames
    # The pool the flags size: the CPU's, an AFD lane's, or a GPU's with --num-pages. Its
    # max_seq_len is the longest sequence the flags allow (--context-length, else the model's).
    pool: PoolConfig
    measure_pool: bool  # a GPU without --num-pages: the engine re-sizes the pool from measured memory
    cuda_graphs: bool  # decode replays captured CUDA graphs

    @property
    def piecewise_max_tokens(self) -> int:
        """The largest step replayed from piecewise CUDA graphs (0: none)."""
        if not self.cuda_graphs:
            return 0
        top = self.args.piecewise_cuda_graph_max_tokens
        return self.args.chunked_prefill_size + 512 if top is None else top

    @property
    def model_path(self) -> str:
        return self.args.model_path

    @property
    def max_seq_len(self) -> int:
        return self.pool.max_seq_len

    @property
    def fp8(self) -> QuantConfig | None:
        return fp8_storage(self.config, self.device)

    def layout(self, parallel: ParallelConfig = SINGLE) -> PoolLayout:
        """What one rank's pool stores (the whole model's at TP 1)."""
        return pool_layout(self.config, parallel)

    def on_device(self, device: torch.device | str) -> "EnginePlan":
        """The same plan for a process on `device` (a TP follower, an AFD worker): the device's own
        backends, graphs and pool sizing."""
        return _resolve(replace(self.args, device=str(device)), self.config)


def _measures_pool(args: EngineArgs, device: torch.device) -> bool:
    """The pool is planned from measured memory on a GPU unless --num-pages pins it; the CPU keeps the
    flags' sizes so tests stay deterministic."""
    if device.type != "cuda":
        if args.mem_fraction_static is not None:
            raise ValueError("mem_fraction_static sizes the pool from GPU memory; on the CPU use --num-pages "
                             "and --max-running-requests")
        return False
    return args.num_pages is None


def _resolve(args: EngineArgs, config: ModelConfig) -> EnginePlan:
    if args.context_length is not None and args.context_length > config.max_position_embeddings:
        raise ValueError(
            f"context_length {args.context_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}"
        )
    device = resolve_device(args.device)
    # The flags' slots (the CPU's, or a pool pinned by --num-pages); a measured pool replans them.
    if args.max_mamba_cache_size is not None:
        running, cache_slots = slot_split(args.max_mamba_cache_size, args.max_running_requests,
                                          args.enable_prefix_caching)
    else:
        running = args.max_running_requests or CPU_MAX_RUNNING_REQUESTS
        cache_slots = cache_slots_for(running, args.enable_prefix_caching)
    pool = PoolConfig(
        max_running_requests=running,
        cache_slots=cache_slots,
        max_seq_len=args.context_length or config.max_position_embeddings,
        page_size=args.page_size,
        num_pages=args.num_pages,
        ssm_dtype=args.mamba_ssm_dtype or config.mamba_ssm_dtype,
        kv_dtype=KV_CACHE_DTYPES[args.kv_cache_dtype],
        prefix_cache=args.enable_prefix_caching,
    )
    return EnginePlan(
        args=replace(args, device=str(device)),
        config=config,
        device=device,
        dtype=getattr(torch, config.dtype if args.dtype == "auto" else args.dtype),
        backends=BackendNames.resolve(args.attention_backend, args.gdn_backend, args.moe_backend, device),
        pool=pool,
        measure_pool=_measures_pool(args, device),
        cuda_graphs=device.type == "cuda" and not args.disable_cuda_graph,
    )


def resolve_plan(args: EngineArgs) -> EnginePlan:
    """Read the config (before any weight loads) and resolve everything the flags leave open. A
    context the model cannot reach, or a pool too small for one request, is an error here."""
    if args.model_path is None:  # the embedded tiny model, assembled on first use
        args = replace(args, model_path=default_model_path())
    return _resolve(args, load_config(args.model_path))
