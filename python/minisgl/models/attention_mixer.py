"""Full attention with per-head q/k norm, partial RoPE and (Qwen3.5) a sigmoid output gate.

Under TP a rank holds its query heads (column-parallel q_proj, gate rows included), the KV heads
they read (split, or replicated when there are fewer KV heads than ranks) and the matching
columns of o_proj, whose partial sums are the mixer's one all-reduce."""
from __future__ import annotations

import torch
from torch import nn

from minisgl.attention.backend import AttentionBackend
from minisgl.attention.paged_kv import PagedKV
from minisgl.kernels.activations import Activations
from minisgl.kernels.fp8_format import rows_split_into_groups
from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.layers.linear import column_parallel, row_parallel
from minisgl.layers.norm import RMSNorm
from minisgl.layers.row_stack import RowStack, layer_outputs, row_stack_fits
from minisgl.layers.rotary import RotaryEmbedding
from minisgl.models.config import ModelConfig
from minisgl.models.context import ForwardContext
from minisgl.parallel.collectives import all_reduce
from minisgl.parallel.config import SINGLE, ParallelConfig


class Attention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_id: int, rotary: RotaryEmbedding, backend: AttentionBackend,
        parallel: ParallelConfig = SINGLE,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.parallel = parallel
        self.head_dim = d = config.head_dim
        self.gated = config.attn_output_gate
        h, q_rows = config.hidden_size, d * (2 if self.gated else 1)  # with the gate: [query (d), gate (d)] per head
        full_q, full_kv = config.num_heads, config.num_kv_heads
        sharded = parallel.tp_size > 1
        h0, h1 = parallel.part(full_q)
        k0, k1 = parallel.kv_head_range(full_kv)
        self.num_heads, self.num_kv_heads = h1 - h0, k1 - k0
        q_range = ((h0 * q_rows, h1 * q_rows),) if sharded else ()
        kv_range = ((k0 * d, k1 * d),) if sharded else ()
        self.q_proj = column_parallel(h, full_q * q_rows, *q_range)
        self.k_proj = column_parallel(h, full_kv * d, *kv_range)
        self.v_proj = column_parallel(h, full_kv * d, *kv_range)
        self.o_proj = row_parallel(full_q * d, h, *(((h0 * d, h1 * d),) if sharded else ()))
        self.qkv: RowStack | None = None  # q's, k's and v's weights in one storage (stack_rows)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, config.zero_centered_norm)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, config.zero_centered_norm)
        self.rotary = rotary
        self.backend = backend
        self.gate_codes = False  # the output gate writes o_proj's FP8 codes (feed_fp8_codes)

    def stack_rows(self, device: torch.device) -> None:
        """Called by materialize once the layers' dtypes are final: q, k and v as one GEMM where their
        weights can share one storage (layers/row_stack.py): two fewer launches a layer at decode."""
        if row_stack_fits((self.q_proj, self.k_proj, self.v_proj)):
            self.qkv = RowStack((self.q_proj, self.k_proj, self.v_proj), device)

    @property
    def reads_fp8(self) -> bool:
        """Whether q, k and v quantise their input (layers/norm.py's fp8_output)."""
        return isinstance(self.q_proj, Fp8Linear)

    def feed_fp8_codes(self) -> None:
        """Called by materialize once the dtypes are final: as the norms do for their readers, the
        output gate writes o_proj's codes where o_proj is FP8 and a head splits into 128-groups."""
        self.gate_codes = self.gated and isinstance(self.o_proj, Fp8Linear) and rows_split_into_groups((1, self.head_dim))

    def forward(self, x: torch.Tensor | Activations, ctx: ForwardContext) -> torch.Tensor:
        xin = Activations.of(x)  # q, k and v's one input, quantised once on FP8 weights
        t, d = xin.x.shape[0], self.head_dim
        # Stacked, each output is a column block of one [T, q + k + v] tensor: rows strided, read in place.
        q, k, v = layer_outputs(self.qkv, (self.q_proj, self.k_proj, self.v_proj), xin)
        q = q.view(t, self.num_heads, -1)
        q, gate = q.split(d, dim=-1) if self.gated else (q, None)  # strided views of [query | gate]
        q = self.rotary.apply_normed(q, self.q_norm, ctx.cos, ctx.sin)
        k = self.rotary.apply_normed(k.view(t, self.num_kv_heads, d), self.k_norm, ctx.cos, ctx.sin)
        v = v.view(t, self.num_kv_heads, d)
        o = ctx.mixer_core(self._attend, q, k, v)
        o = _output_gate(o, gate, self.gate_codes) if gate is not None else o.reshape(t, self.num_heads * d)
        return all_reduce(self.o_proj(o), self.parallel)

    def _attend(self, ctx: ForwardContext, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Write the new K/V into the pages and attend over each request's cached ones (into `out`)."""
        kv = PagedKV(*ctx.pool.kv.layer(self.layer_id), ctx.pool.page_table, ctx.pool.page_size)
        return self.backend.forward(q, k, v, kv, ctx.batch, self.head_dim**-0.5, out=out)


def _output_gate(o: torch.Tensor, gate: torch.Tensor, codes: bool) -> torch.Tensor | Activations:
    """o · sigmoid(gate) for both [T, heads, head_dim] -> [T, heads·head_dim] (with its FP8 codes:
    Activations). On CUDA one launch that reads the gate in place; the CPU path, which never
    quantises, keeps its flat, copied gate (the reference's exact ops)."""
    if o.is_cuda:
        from minisgl.kernels.sigmoid_gate import sigmoid_gate

        y = sigmoid_gate(o, gate, quantise=codes)
        return y if codes else y.flatten(1)
    return o.flatten(1) * torch.sigmoid(gate.flatten(1))
