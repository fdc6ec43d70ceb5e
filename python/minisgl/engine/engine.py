"""Engine: loads the model and its weights onto the device, owns the hybrid pool and the backends,
and runs one batched forward per step."""
from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import replace
from typing import Callable

import torch
from torch import nn

from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.engine import compile_watch
from minisgl.engine.args import CPU_MAX_RUNNING_REQUESTS, EngineArgs
from minisgl.engine.device_memory import DevicePreparation, prepare_on_device
from minisgl.engine.graph import DecodeGraphRunner
from minisgl.engine.tp_group import READY, JournaledPool, TpGroup, TpStep
from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.models.config import ModelConfig, QuantConfig, load_config
from minisgl.models.context import Backends
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.materialize import materialize
from minisgl.models.registry import MODELS
from minisgl.models.sharding import check_parallel
from minisgl.models.weights import WeightFilter, load_weights
from minisgl.moe.registry import MOE_BACKENDS
from minisgl.parallel.collectives import broadcast_from_leader
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.registry import Registry
from minisgl.models.tiny.default import default_model_path

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pool_layout(config: ModelConfig, parallel: ParallelConfig = SINGLE) -> PoolLayout:
    """What one rank stores: under TP its KV heads (one replicated head when there are fewer KV
    heads than ranks), and its GDN key/value heads' conv channels and recurrent state."""
    k0, k1 = parallel.kv_head_range(config.num_kv_heads)
    tp = parallel.tp_size
    linear = bool(config.linear_layers)
    return PoolLayout(
        full_layers=config.full_layers,
        num_kv_heads=k1 - k0,
        head_dim=config.head_dim,
        linear_layers=config.linear_layers,
        conv_dim=config.conv_dim // tp if linear else 0,
        conv_kernel=config.linear_conv_kernel_dim,
        num_value_heads=config.linear_num_value_heads // tp if linear else 0,
        key_head_dim=config.linear_key_head_dim,
        value_head_dim=config.linear_value_head_dim,
    )


def with_model_path(args: EngineArgs) -> EngineArgs:
    """Without --model-path, the embedded tiny model (built on first use)."""
    return args if args.model_path is not None else replace(args, model_path=default_model_path())


def model_dtype(args: EngineArgs, config: ModelConfig) -> torch.dtype:
    return getattr(torch, config.dtype if args.dtype == "auto" else args.dtype)


def max_seq_len(args: EngineArgs, config: ModelConfig) -> int:
    return args.context_length or config.max_position_embeddings


def check_context(args: EngineArgs, config: ModelConfig) -> None:
    """Before any weight loads: a context the model cannot reach is a mistake in the flags."""
    if args.context_length is not None and args.context_length > config.max_position_embeddings:
        raise ValueError(
            f"context_length {args.context_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}"
        )


def pool_config(args: EngineArgs, config: ModelConfig) -> PoolConfig:
    """One lane's pool from the flags alone (the CPU, an AFD lane, or --num-pages on a GPU); the AFD
    coordinator derives the same config to mirror a worker's allocator."""
    return PoolConfig(
        max_running_requests=args.max_running_requests or CPU_MAX_RUNNING_REQUESTS,
        max_seq_len=max_seq_len(args, config),
        page_size=args.page_size,
        num_pages=args.num_pages,
        ssm_dtype=args.mamba_ssm_dtype or config.mamba_ssm_dtype,
    )


def plans_on_device(args: EngineArgs, device: torch.device) -> bool:
    """The pool is planned from measured memory on a GPU unless --num-pages pins it; the CPU keeps the
    flags' sizes so tests stay deterministic."""
    if device.type != "cuda":
        if args.mem_fraction_static is not None:
            raise ValueError("mem_fraction_static sizes the pool from GPU memory; on the CPU use --num-pages "
                             "and --max-running-requests")
        return False
    return args.num_pages is None


_REGISTRIES: dict[str, Registry] = {"attention": ATTENTION_BACKENDS, "gdn": GDN_BACKENDS, "moe": MOE_BACKENDS}


def _auto(family: str, device: torch.device) -> str:
    """The default backend of a family on this device: the torch references on the CPU, our
    kernels on CUDA (fla's chunked prefill for GDN when it is installed)."""
    if device.type != "cuda":
        return "torch"
    if family == "gdn":
        return "fla" if importlib.util.find_spec("fla") is not None else "triton"
    return "triton" if "triton" in _REGISTRIES[family].names() else "torch"


def build_backend(family: str, name: str, device: torch.device) -> object:
    return _REGISTRIES[family].get(_auto(family, device) if name == "auto" else name)()


def build_backends(args: EngineArgs, device: torch.device) -> Backends:
    return Backends(
        attention=build_backend("attention", args.attention_backend, device),
        gdn=build_backend("gdn", args.gdn_backend, device),
        moe=build_backend("moe", args.moe_backend, device),
    )


def fp8_storage(config: ModelConfig, device: torch.device) -> QuantConfig | None:
    """The FP8 layout to hold weights in: the checkpoint's on the GPU; none on the CPU, where the
    loader dequantises (the torch references compute in the model dtype)."""
    return config.quant if device.type == "cuda" else None


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


class Engine:
    def __init__(
        self,
        args: EngineArgs,
        weight_filter: WeightFilter | None = None,
        mlp_factory: Callable[[int], nn.Module] | None = None,
        max_prefill_tokens: int = 16384,
        warm_up: bool = True,
        parallel: ParallelConfig | None = None,
    ) -> None:
        """mlp_factory(layer_id) replaces the local MoE blocks (an AFD attention worker's remote ones).
        warm_up=False skips the device's warm-up and memory planning: an AFD attention worker's steps
        need its expert workers in lock-step, so it cannot run them alone (its pool keeps the flags'
        sizes). max_prefill_tokens is the largest prefill step the scheduler will run.

        parallel: this process's rank of a TP group that someone else started (a colocated
        follower, a rank of an AFD lane). Without it and with --tp-size > 1, this engine starts
        the followers (engine/tp_group.py) and is their rank 0."""
        started = time.monotonic()
        self.args = args = with_model_path(args)
        self.model_path: str = args.model_path
        self.config = load_config(self.model_path)
        check_context(args, self.config)
        group: TpGroup | None = None
        if parallel is None:
            check_parallel(self.config, args.tp_size, args.ep_size)
            if args.tp_size > 1:
                group = TpGroup(args, max_prefill_tokens)
                parallel = group.parallel
                self.args = args = replace(args, device=group.devices[0])
        self.parallel = parallel or SINGLE
        self.followers: TpGroup | None = None  # set once this rank 0 is ready to serve
        try:
            self._build(args, weight_filter, mlp_factory, max_prefill_tokens, warm_up, journaled=group is not None)
            if group is not None:
                group.wait_for(READY)
        except BaseException:
            if group is not None:
                group.close(timeout_s=0)
            raise
        self.followers = group
        self.startup_seconds = time.monotonic() - started
        self._log_pool()

    def _build(
        self, args: EngineArgs, weight_filter: WeightFilter | None, mlp_factory: Callable[[int], nn.Module] | None,
        max_prefill_tokens: int, warm_up: bool, journaled: bool,
    ) -> None:
        self.device = resolve_device(args.device)
        planned = plans_on_device(args, self.device) and warm_up
        self.dtype = model_dtype(args, self.config)
        backends = build_backends(args, self.device)
        arch = MODELS.get(self.config.arch)
        if self.device.type == "cuda":
            compile_watch.install()
        self.model = build_module(
            lambda: arch(self.config, backends, mlp_factory, self.parallel), self.dtype, self.device,
            fp8_storage(self.config, self.device),
        )
        if args.load_format == "dummy":
            init_dummy_weights(self.model, args.seed)
        else:
            load_weights(self.model, self.model_path, self.config, weight_filter)
        self.model.eval()
        self.layout = pool_layout(self.config, self.parallel)
        self.preparation: DevicePreparation | None = None
        with compile_watch.warming_up():
            if planned:
                self.preparation = prepare_on_device(self, max_prefill_tokens)
                self.pool_cfg = self.preparation.pool_config
            else:
                self.pool_cfg = pool_config(args, self.config)
            self.max_seq_len = self.pool_cfg.max_seq_len
            self.pool = (JournaledPool if journaled else HybridPool)(self.layout, self.pool_cfg, self.dtype, self.device)
            self.graph_runner = self._capture_graphs(backends)
            if planned:
                self.preparation.warm_up_final(self)

    def close(self) -> None:
        """Stop the TP followers this engine started (nothing to do otherwise)."""
        if self.followers is not None:
            self.followers.close()
            self.followers = None

    def warmup_summary(self) -> dict[str, float | int | str]:
        """What warm-up cost and what the planner chose, for /server_info."""
        prep = self.preparation
        if prep is None:
            return {}
        return {"warmup_seconds": prep.warmup_seconds, "warmup_compiles": prep.warmup_compiles,
                "memory": prep.describe(self.startup_seconds)}

    def _log_pool(self) -> None:
        if self.preparation is not None:
            logger.info("%s", self.preparation.describe(self.startup_seconds))
            return
        kv_mb = (self.pool.kv.nbytes if self.pool.kv else 0) / 2**20
        state_mb = (self.pool.state.nbytes if self.pool.state else 0) / 2**20
        logger.info(
            "pool: %d KV pages of %d tokens (%.1f MiB), %d state slots (%.1f MiB); max concurrency %d at %d tokens",
            self.pool.total_pages, self.args.page_size, kv_mb, self.pool.max_running, state_mb,
            min(self.pool.max_running, self.pool.total_pages // self.pool_cfg.pages_per_request), self.max_seq_len,
        )

    def _capture_graphs(self, backends: Backends) -> DecodeGraphRunner | None:
        if self.device.type != "cuda" or self.args.disable_cuda_graph:
            return None
        unsafe = [type(b).__name__ for b in (backends.attention, backends.gdn, backends.moe)
                  if not getattr(b, "cuda_graph_safe", False)]
        if unsafe:
            logger.warning("CUDA graphs off: %s synchronise with the host in decode", ", ".join(unsafe))
            return None
        max_bs = self.args.cuda_graph_max_bs or self.pool.max_running
        runner = DecodeGraphRunner(self._forward, self.pool, self.max_seq_len, max_bs)
        logger.info("captured decode CUDA graphs for batch sizes %s", runner.buckets)
        return runner

    def make_batch(self, tokens: list[list[int]], prefix_lens: list[int], slots: list[int]) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix_lens, slots, self.pool.page_table, self.pool.page_size, self.device)

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [R, V] of the flat token rows `rows` (default: each request's last token, [B, V])."""
        if self.followers is not None:
            self.followers.send(TpStep(self.pool.take_ops(), batch.prefix_lens, batch.extend_lens, batch.slot_ids,
                                       None if rows is None else rows.numel()))
        if rows is None and self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        return self._forward(batch, self.pool, rows)

    def _forward(self, batch: ForwardBatch, pool: HybridPool, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The step every TP rank runs (and a decode graph captures): rank 0's input ids (and logit
        rows), then the model."""
        if self.parallel.tp_size > 1:
            broadcast_from_leader(batch.input_ids, self.parallel)
            if rows is not None:
                broadcast_from_leader(rows, self.parallel)
        return self.model(batch, pool, rows)
