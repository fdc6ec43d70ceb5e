"""Engine: loads the model and its weights onto the device, owns the hybrid pool and the backends,
and runs one batched forward per step."""
from __future__ import annotations

import logging
from dataclasses import replace

import torch

from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.engine.args import EngineArgs
from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.models.config import ModelConfig, load_config
from minisgl.models.context import Backends
from minisgl.models.registry import MODELS
from minisgl.models.weights import WeightFilter, load_weights
from minisgl.moe.registry import MOE_BACKENDS
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


class Engine:
    def __init__(self, args: EngineArgs, weight_filter: WeightFilter | None = None) -> None:
        if args.model_path is None:
            args = replace(args, model_path=default_model_path())
        self.args = args
        self.model_path: str = args.model_path
        self.config = load_config(self.model_path)
        self.device = resolve_device(args.device)
        self.dtype = getattr(torch, self.config.dtype if args.dtype == "auto" else args.dtype)
        self.max_seq_len = args.context_length or self.config.max_position_embeddings
        backends = Backends(
            attention=ATTENTION_BACKENDS.get(args.attention_backend)(),
            gdn=GDN_BACKENDS.get(args.gdn_backend)(),
            moe=MOE_BACKENDS.get(args.moe_backend)(),
        )
        prev_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = MODELS.get(self.config.arch)(self.config, backends)
        finally:
            torch.set_default_dtype(prev_dtype)
        load_weights(self.model, self.model_path, self.config, weight_filter)
        self.model.eval()
        pool_cfg = PoolConfig(
            max_running_requests=args.max_running_requests,
            max_seq_len=self.max_seq_len,
            page_size=args.page_size,
            num_pages=args.num_pages,
            ssm_dtype=args.mamba_ssm_dtype or self.config.mamba_ssm_dtype,
        )
        self.pool = HybridPool(pool_layout(self.config), pool_cfg, self.dtype, self.device)
        kv_mb = (self.pool.kv.nbytes if self.pool.kv else 0) / 2**20
        state_mb = (self.pool.state.nbytes if self.pool.state else 0) / 2**20
        logger.info(
            "pool: %d KV pages of %d tokens (%.1f MiB), %d state slots (%.1f MiB); max concurrency %d at %d tokens",
            self.pool.total_pages, args.page_size, kv_mb, args.max_running_requests, state_mb,
            min(args.max_running_requests, self.pool.total_pages // pool_cfg.pages_per_request), self.max_seq_len,
        )

    def make_batch(self, tokens: list[list[int]], prefix_lens: list[int], slots: list[int]) -> ForwardBatch:
        return ForwardBatch.build(tokens, prefix_lens, slots, self.pool.page_table, self.pool.page_size, self.device)

    @torch.inference_mode()
    def forward_batch(self, batch: ForwardBatch, all_logits: bool = False) -> torch.Tensor:
        """fp32 logits of each request's last token [B, V] (or of every token, [T, V])."""
        return self.model(batch, self.pool, all_logits=all_logits)
