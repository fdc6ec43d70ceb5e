"""Engine: loads the model and its weights onto the device, owns the hybrid pool and the backends,
and runs one batched forward per step."""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import replace
from typing import Callable

import torch
from torch import nn

from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.engine.args import EngineArgs
from minisgl.engine.graph import DecodeGraphRunner
from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.models.config import ModelConfig, QuantConfig, load_config
from minisgl.models.context import Backends
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.materialize import materialize
from minisgl.models.registry import MODELS
from minisgl.models.weights import WeightFilter, load_weights
from minisgl.moe.registry import MOE_BACKENDS
from minisgl.registry import Registry
from minisgl.tools.make_tiny_model import default_model_path

logger = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pool_layout(config: ModelConfig) -> PoolLayout:
    return PoolLayout(
        full_layers=config.full_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        linear_layers=config.linear_layers,
        conv_dim=config.conv_dim,
        conv_kernel=config.linear_conv_kernel_dim,
        num_value_heads=config.linear_num_value_heads,
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


def pool_config(args: EngineArgs, config: ModelConfig) -> PoolConfig:
    """One lane's pool; the AFD coordinator derives the same config to mirror a worker's allocator."""
    return PoolConfig(
        max_running_requests=args.max_running_requests,
        max_seq_len=max_seq_len(args, config),
        page_size=args.page_size,
        num_pages=args.num_pages,
        ssm_dtype=args.mamba_ssm_dtype or config.mamba_ssm_dtype,
    )


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
    ) -> None:
        """mlp_factory(layer_id) replaces the local MoE blocks (an AFD attention worker's remote ones)."""
        self.args = args = with_model_path(args)
        self.model_path: str = args.model_path
        self.config = load_config(self.model_path)
        self.device = resolve_device(args.device)
        self.dtype = model_dtype(args, self.config)
        self.max_seq_len = max_seq_len(args, self.config)
        backends = build_backends(args, self.device)
        arch = MODELS.get(self.config.arch)
        self.model = build_module(
            lambda: arch(self.config, backends, mlp_factory), self.dtype, self.device, fp8_storage(self.config, self.device)
        )
        if args.load_format == "dummy":
            init_dummy_weights(self.model, args.seed)
        else:
            load_weights(self.model, self.model_path, self.config, weight_filter)
        self.model.eval()
        pool_cfg = pool_config(args, self.config)
        self.pool = HybridPool(pool_layout(self.config), pool_cfg, self.dtype, self.device)
        kv_mb = (self.pool.kv.nbytes if self.pool.kv else 0) / 2**20
        state_mb = (self.pool.state.nbytes if self.pool.state else 0) / 2**20
        logger.info(
            "pool: %d KV pages of %d tokens (%.1f MiB), %d state slots (%.1f MiB); max concurrency %d at %d tokens",
            self.pool.total_pages, args.page_size, kv_mb, args.max_running_requests, state_mb,
            min(args.max_running_requests, self.pool.total_pages // pool_cfg.pages_per_request), self.max_seq_len,
        )

        self.graph_runner: DecodeGraphRunner | None = None
        if self.device.type == "cuda" and not args.disable_cuda_graph:
            unsafe = [type(b).__name__ for b in (backends.attention, backends.gdn, backends.moe)
                      if not getattr(b, "cuda_graph_safe", False)]
            if unsafe:
                logger.warning("CUDA graphs off: %s synchronise with the host in decode", ", ".join(unsafe))
            else:
                self.graph_runner = DecodeGraphRunner(self.model, self.pool, self.max_seq_len, args.cuda_graph_max_bs)
                logger.info("captured decode CUDA graphs for batch sizes %s", self.graph_runner.buckets)

    def make_batch(self, tokens: list[list[int]], prefix_lens: list[int], slots: list[int]) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix_lens, slots, self.pool.page_table, self.pool.page_size, self.device)

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch, all_logits: bool = False) -> torch.Tensor:
        """fp32 logits of each request's last token [B, V] (or of every token, [T, V])."""
        if not all_logits and self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        return self.model(batch, self.pool, all_logits=all_logits)
