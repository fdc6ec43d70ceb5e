"""Per-item costs for the pipeline simulator, from the model's shapes: a roofline (bytes over HBM
bandwidth, or FLOPs over peak, whichever is slower, plus a fixed launch cost) for decode.

What each item moves, per micro-batch of b requests with total context S:
- GDN layer (AG): its projections' weights, plus each request's fp32 SSM state read and written
  (H_v·d_k·d_v·4 B, 4 MiB at 122B/397B shapes) and its conv state.
- full-attention layer (AG): its projections' weights, plus S tokens of K and V
  (2·H_kv·d·2 B = 2 KiB per token at 122B/397B shapes).
- router (AG, before the send) and shared expert (AG, after the send): their weights.
- experts (one EG, E/N of them): every expert hit by the M·b tokens it receives (every token goes
  to every EG); with random routing nearly all of them at decode batch sizes.
- transfers: latency plus bytes over the link; a dispatch carries hidden states, ids and weights to
  all N EGs, a combine brings N partial sums back; an EG receives from all M lanes.
The defaults are assumptions about an H200 node, not measurements; `--measured` replaces them.
"""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.models.config import ModelConfig


@dataclass(frozen=True)
class Hardware:
    hbm_tbps: float = 3.0  # achieved HBM bandwidth: fla's GDN decode reaches 2.9 TB/s on an H200
    tflops: float = 600.0  # achieved bf16 matmul: about 3/4 of the 790 TFLOP/s measured
    link_gbps: float = 400.0  # NVLink 4, one direction, per GPU (450 GB/s nominal)
    link_latency_us: float = 10.0  # one NCCL point-to-point exchange of a small message
    launch_us: float = 10.0  # per item and side: kernel launches and small ops

    def time_us(self, nbytes: float, flops: float = 0.0) -> float:
        return self.launch_us + max(nbytes / (self.hbm_tbps * 1e6), flops / (self.tflops * 1e6))

    def link_us(self, nbytes: float) -> float:
        return self.link_latency_us + nbytes / (self.link_gbps * 1e3)


class Roofline:
    """Decode costs of one micro-batch, in µs."""

    def __init__(self, config: ModelConfig, hw: Hardware = Hardware(), fp8: bool = False) -> None:
        self.c, self.hw = config, hw
        self.wbytes = 1 if fp8 else 2  # projection and expert weights; lm_head and router stay bf16
        c = config
        h = c.hidden_size
        self.gdn_params = h * (c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads) + c.linear_value_dim * h
        q_width = c.num_heads * c.head_dim * (2 if c.attn_output_gate else 1)
        self.full_params = h * (q_width + 2 * c.num_kv_heads * c.head_dim) + c.num_heads * c.head_dim * h
        self.router_params = h * c.num_experts
        self.shared_params = 3 * h * c.shared_expert_intermediate_size + h
        self.expert_params = 3 * h * c.moe_intermediate_size

    def attn(self, kind: str, batch: int, context: int) -> float:
        """Norms, mixer and router of `batch` requests whose contexts sum to `context`."""
        c, w = self.c, self.wbytes
        router = self.router_params * 2
        if kind == "gdn":
            state = batch * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
            conv = batch * c.conv_dim * (c.linear_conv_kernel_dim - 1) * 2
            nbytes = self.gdn_params * w + 2 * (state + conv) + router
            return self.hw.time_us(nbytes, 2 * batch * self.gdn_params)
        kv = context * 2 * c.num_kv_heads * c.head_dim * 2
        flops = 2 * batch * self.full_params + 4 * context * c.num_heads * c.head_dim
        return self.hw.time_us(self.full_params * w + kv + router, flops)

    def shared(self, batch: int) -> float:
        if not self.c.shared_expert_intermediate_size:
            return 0.0
        return self.hw.time_us(self.shared_params * self.wbytes, 2 * batch * self.shared_params)

    def expert(self, tokens: int, expert_workers: int) -> float:
        """One EG's experts (E/N of them) over `tokens` routed rows, each with top-k of all E."""
        c = self.c
        local = c.num_experts / expert_workers
        touched = local * (1 - (1 - c.top_k / c.num_experts) ** tokens)
        flops = 2 * self.expert_params * tokens * c.top_k / expert_workers
        return self.hw.time_us(touched * self.expert_params * self.wbytes, flops)

    def tail(self, batch: int) -> float:
        head = self.c.hidden_size * self.c.vocab_size
        return self.hw.time_us(head * 2, 2 * batch * head)

    def head(self, batch: int) -> float:
        return self.hw.launch_us

    def transfers(self, batch: int, attn_workers: int, expert_workers: int) -> tuple[float, float]:
        """(dispatch, combine) µs of one micro-batch of `batch` requests per lane."""
        h, k = self.c.hidden_size, self.c.top_k
        row = h * 2 + k * 8  # bf16 hidden, int32 id and fp32 weight per expert
        dispatch = batch * row * max(expert_workers, attn_workers)  # an AG sends N copies; an EG receives M
        combine = batch * h * 2 * max(expert_workers, attn_workers)
        return self.hw.link_us(dispatch), self.hw.link_us(combine)
