"""Qwen3.5-MoE: 3:1 interleaved Gated DeltaNet and gated full attention, every layer an MoE.
Qwen3-MoE runs on the same definition (all layers full attention; see models/registry.py).

The one model definition for every mode: the MoE block is injected (`mlp_factory`), so colocated
runs use LocalMoE and an AFD attention worker a remote block, with no twin model. Tensor
parallelism is the same definition too: `parallel` says which rank this is, and each layer holds
its rank's share (see models/sharding.py); the vocabulary-parallel logits are gathered here.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from minisgl.kernels.activations import Activations
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.layers.embedding import Embedding
from minisgl.layers.linear import column_parallel
from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.forward_batch import ForwardBatch
from minisgl.models.attention_mixer import Attention
from minisgl.models.config import FULL_ATTENTION, ModelConfig
from minisgl.models.context import Backends, CoreRunner, ForwardContext, run_core
from minisgl.models.gdn_mixer import GatedDeltaNet
from minisgl.moe.local_moe import LocalMoE
from minisgl.parallel.collectives import gather_last_dim
from minisgl.parallel.config import SINGLE, ParallelConfig

MlpFactory = Callable[[int], nn.Module]


def local_moe_factory(config: ModelConfig, backends: Backends, parallel: ParallelConfig = SINGLE) -> MlpFactory:
    def make(layer_id: int) -> nn.Module:
        return LocalMoE(
            config.hidden_size,
            config.num_experts,
            config.top_k,
            config.moe_intermediate_size,
            config.shared_expert_intermediate_size,
            config.norm_topk_prob,
            backends.moe,
            parallel,
        )

    return make


class Qwen3_5MoeDecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, backends: Backends, mlp: nn.Module,
        parallel: ParallelConfig = SINGLE,
    ) -> None:
        super().__init__()
        self.is_full = config.layer_types[layer_id] == FULL_ATTENTION
        if self.is_full:
            self.self_attn = Attention(config, layer_id, rotary, backends.attention, parallel)
        else:
            self.linear_attn = GatedDeltaNet(config, layer_id, backends.gdn, parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        self.mlp = mlp

    def feed_fp8_codes(self) -> None:
        """Called by materialize once the dtypes are final: a norm whose readers quantise its output
        writes their FP8 codes in its own pass (layers/norm.py)."""
        mixer = self.self_attn if self.is_full else self.linear_attn
        self.input_layernorm.feed_fp8(mixer.reads_fp8)
        self.post_attention_layernorm.feed_fp8(self.mlp.reads_fp8)

    def mixer_half(self, x: torch.Tensor, ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor | Activations]:
        """Everything before the MoE block: returns (residual h, the MoE block's input)."""
        mixer = self.self_attn if self.is_full else self.linear_attn
        return self.post_attention_layernorm.add_and_norm(x, mixer(self.input_layernorm(x), ctx))

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h, y = self.mixer_half(x, ctx)
        return self.mlp(y, residual=h)  # h + mlp(y), which a local MoE block adds in its combine pass


class Qwen3_5MoeForCausalLM(nn.Module):
    def __init__(
        self, config: ModelConfig, backends: Backends, mlp_factory: MlpFactory | None = None,
        parallel: ParallelConfig = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.parallel = parallel
        make_mlp = mlp_factory or local_moe_factory(config, backends, parallel)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, parallel)
        self.layers = nn.ModuleList(
            Qwen3_5MoeDecoderLayer(config, i, self.rotary, backends, make_mlp(i), parallel)
            for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm)
        vocab = (parallel.part(config.vocab_size),) if parallel.tp_size > 1 else ()
        self.lm_head = None if config.tie_word_embeddings else column_parallel(config.hidden_size, config.vocab_size, *vocab)

    def embed(self, batch: ForwardBatch, pool: HybridPool, cores: CoreRunner = run_core) -> tuple[torch.Tensor, ForwardContext]:
        x = self.embed_tokens(batch.input_ids)
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        return x, ForwardContext(batch, pool, cos, sin, cores)

    def logits(self, x: torch.Tensor, batch: ForwardBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [R, V] of the flat token rows `rows` (default: each request's last token).
        Only the rows asked for go through the head: [T, V] for a long prompt would not fit."""
        x = x[batch.logit_idx if rows is None else rows]
        x = self.norm(x)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return gather_last_dim(torch.nn.functional.linear(x, head), self.parallel).float()

    def hidden(self, batch: ForwardBatch, pool: HybridPool, cores: CoreRunner = run_core) -> torch.Tensor:
        """[T, H]: every layer's output for every token of the step, before the final norm."""
        x, ctx = self.embed(batch, pool, cores)
        for layer in self.layers:
            x = layer(x, ctx)
        return x

    def forward(self, batch: ForwardBatch, pool: HybridPool, rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits(self.hidden(batch, pool), batch, rows)
