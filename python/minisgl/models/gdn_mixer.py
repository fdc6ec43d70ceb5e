"""Gated DeltaNet token mixer: projections, causal conv, gated delta rule, gated RMSNorm, out_proj.

Per-request conv and SSM state live in the StatePool and are updated in place by the backend.
Under TP a rank holds its key heads and their value heads: its q, k and v rows of in_proj_qkv
(three ranges of the fused weight) and the same conv channels, its rows of in_proj_z/a/b, A_log
and dt_bias, and the matching columns of out_proj, whose partial sums are the mixer's one
all-reduce; its state pool holds only its channels and heads."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from minisgl.forward_batch import ForwardBatch
from minisgl.gdn.backend import GDNBackend
from minisgl.gdn.delta_inputs import DeltaInputs
from minisgl.gdn.prefill_states import conv_snapshots, delta_prefill
from minisgl.kernels.activations import Activations
from minisgl.kernels.planar_out import PlanarOut
from minisgl.layers.fp8_linear import Fp8Linear
from minisgl.layers.linear import column_parallel, row_parallel
from minisgl.layers.norm import GatedRMSNorm
from minisgl.layers.row_pieces import RowPieces
from minisgl.layers.row_stack import RowStack, layer_outputs, row_stack_fits
from minisgl.models.config import ModelConfig
from minisgl.models.context import ForwardContext
from minisgl.parallel.collectives import all_reduce
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.parallel.shard import Shard


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, backend: GDNBackend, parallel: ParallelConfig = SINGLE) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.parallel = parallel
        self.k_dim = dk = config.linear_key_head_dim
        self.v_dim = dv = config.linear_value_head_dim
        full_k, full_v = config.linear_num_key_heads, config.linear_num_value_heads
        k0, k1 = parallel.part(full_k)
        v0, v1 = parallel.part(full_v)
        self.num_k_heads, self.num_v_heads = k1 - k0, v1 - v0
        h, kernel = config.hidden_size, config.linear_conv_kernel_dim
        sharded = parallel.tp_size > 1
        key_dim = full_k * dk
        # The rank's channels of the fused [q | k | v] rows (and conv channels).
        qkv = ((k0 * dk, k1 * dk), (key_dim + k0 * dk, key_dim + k1 * dk), (2 * key_dim + v0 * dv, 2 * key_dim + v1 * dv))
        value_rows = ((v0 * dv, v1 * dv),) if sharded else ()
        heads = ((v0, v1),) if sharded else ()
        self.in_proj_qkv = column_parallel(h, config.conv_dim, *(qkv if sharded else ()))
        self.in_proj_z = column_parallel(h, config.linear_value_dim, *value_rows)
        self.in_proj_b = column_parallel(h, full_v, *heads)
        self.in_proj_a = column_parallel(h, full_v, *heads)
        conv_dim = self.in_proj_qkv.weight.shape[0]
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(conv_dim, 1, kernel), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        if sharded:
            self.conv1d.shards = {"weight": Shard.along((config.conv_dim, 1, kernel), 0, *qkv)}
            self.shards = {name: Shard.along((full_v,), 0, *heads) for name in ("A_log", "dt_bias")}
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = row_parallel(config.linear_value_dim, h, *value_rows)
        self.backend = backend
        self.gates: RowStack | None = None  # b's and a's weights in one storage (stack_rows)

    def stack_rows(self, device: torch.device) -> None:
        """Called by materialize once the layers' dtypes are final: b and a, which FP8 checkpoints keep
        in BF16, as one GEMM (layers/row_stack.py): a launch fewer a layer at decode. qkv and z stay
        apart: FP8 where b and a are not (and the CPU, which holds them alike, must round as the GPU
        does), and z is computed after the core so that it is not held across it."""
        if row_stack_fits((self.in_proj_b, self.in_proj_a)):
            self.gates = RowStack((self.in_proj_b, self.in_proj_a), device)

    @property
    def reads_fp8(self) -> bool:
        """Whether the input projections quantise their input (layers/norm.py's fp8_output)."""
        return isinstance(self.in_proj_qkv, Fp8Linear)

    def feed_fp8_codes(self) -> None:
        """Called by materialize once the dtypes are final: the output norm writes out_proj's codes."""
        self.norm.feed_fp8(isinstance(self.out_proj, Fp8Linear))

    def forward(self, x: torch.Tensor | Activations, ctx: ForwardContext) -> torch.Tensor:
        xin = Activations.of(x)  # the four projections' one input, quantised once on FP8 weights
        t = xin.x.shape[0]
        b, a = layer_outputs(self.gates, (self.in_proj_b, self.in_proj_a), xin)
        o = ctx.mixer_core(self._mix, self.in_proj_qkv(xin), a, b)  # a, b: strided column blocks if stacked
        # xin (x and its codes) outlives the core: with piecewise graphs, graph-pool memory that no
        # core touches and that the next graph reads, as x alone did before.
        z = self.in_proj_z(xin).reshape(t, self.num_v_heads, self.v_dim)
        o = self.norm(o, z)  # [T, HV * V] (o: [T, HV, V] or its RowPieces), with out_proj's codes on FP8
        return all_reduce(self.out_proj(o), self.parallel)

    def _mix(self, ctx: ForwardContext, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor | RowPieces:
        """The causal conv and the gated delta rule over each request's state slot: [T, HV, V] (into
        `out` when given; else perhaps as RowPieces)."""
        batch, t = ctx.batch, mixed_qkv.shape[0]
        conv_state, ssm_state = ctx.pool.state.layer(self.layer_id)
        q, k, v = self._conv(mixed_qkv, self.conv1d.weight[:, 0, :], conv_state, batch).parts()
        q = q.view(t, self.num_k_heads, self.k_dim)
        k = k.view(t, self.num_k_heads, self.k_dim)
        v = v.view(t, self.num_v_heads, self.v_dim)
        return self._delta(DeltaInputs(q, k, v, a, b, self.A_log, self.dt_bias), ssm_state, batch, out)

    def _conv(self, qkv: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, batch: ForwardBatch) -> PlanarOut:
        """The conv's output with q, k and v each contiguous (the delta rule's kernels read them as
        they are; fla would copy strided column slices first). A mixed step's decode rows come first,
        then the prefill rows in the order of the delta rule's calls (ForwardBatch.call_order)."""
        kd = self.num_k_heads * self.k_dim
        out = PlanarOut.empty(qkv.shape[0], qkv.shape[1], (kd, 2 * kd), qkv.dtype, qkv.device)
        if batch.is_decode:
            return self.backend.conv_decode(qkv, weight, conv_state, batch.slots, out=out)
        d, part = batch.leading_decodes, batch.prefill_requests
        if d:
            self.backend.conv_decode(qkv[:d], weight, conv_state, batch.slots[:d], out=out)
        conv_snapshots(qkv[d:], conv_state, part)
        order = part.call_order
        return self.backend.conv_prefill(qkv[d:], weight, part.cu_seqlens, conv_state, part.slots,
                                         max(part.extend_lens), out=out.from_row(d),
                                         row_map=None if order is None else order.rows,
                                         qk_norm=(2 * kd, self.k_dim) if self.backend.prefill_conv_normalises_qk else None)

    def _delta(self, inp: DeltaInputs, ssm_state: torch.Tensor, batch: ForwardBatch,
               out: torch.Tensor | None = None) -> torch.Tensor | RowPieces:
        """A mixed step's leading decodes update their states in place (decode kernel); only the
        prefill requests go through the chunked rule, which copies each request's whole state in
        and out (4 MiB a request at 122B shapes: the cost of a mixed step, measured, before). The
        prefill rows' q and k come L2-normalised from the conv where the backend asks (_conv).
        Rows from several kernels' buffers come as RowPieces, which the output norm reads in place,
        unless `out` is given."""
        if batch.is_decode:
            runs = [(self.backend.delta_decode(inp, ssm_state, batch.slots), 0)]
        else:
            d, part = batch.leading_decodes, batch.prefill_requests
            prefill = replace(inp.rows(d), qk_normed=self.backend.prefill_conv_normalises_qk)
            runs = [(self.backend.delta_decode(inp.rows(0, d), ssm_state, batch.slots[:d]), 0)] if d else []
            runs += [(rows, d + start) for rows, start in self._delta_prefill(prefill, ssm_state, part)]
        if out is not None:
            return RowPieces(tuple(runs), batch.num_tokens).assemble(out)
        return runs[0][0] if len(runs) == 1 else RowPieces(tuple(runs), batch.num_tokens)

    def _delta_prefill(self, inp: DeltaInputs, ssm_state: torch.Tensor,
                       part: ForwardBatch) -> list[tuple[torch.Tensor, int]]:
        """The chunked rule over the prefill requests, a call at a time (prefill_groups.py): the
        output as runs of rows (each call's buffer, split where the step's order leaves it), each with
        its first row among the prefill rows. q, k and v come in the calls' order (the conv wrote them
        so); the gates are gathered into it. States move as the calls' flows say
        (gdn/prefill_states.py)."""
        flows = part.state_flows
        if not part.groups:
            o, _ = delta_prefill(self.backend, inp, part.cu_seqlens, ssm_state, part.slots, part.extend_lens, flows[0])
            return [(o, 0)]
        if part.call_order is not None:
            inp = inp.gates_from(part.call_order.sources)
        handed, runs = None, []
        for g, flow in zip(part.groups, flows):
            o, handed = delta_prefill(self.backend, inp.rows(g.start, g.end), g.cu_seqlens, ssm_state, g.slots,
                                      g.extend_lens, flow, handed)
            runs += [(o[call_row : call_row + n], step_row) for step_row, call_row, n in g.segments]
        return runs
