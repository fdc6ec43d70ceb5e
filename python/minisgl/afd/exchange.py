"""What every AG <-> EG transport shares: the topology, the dispatch message's byte layout, and the
packing and unpacking of messages. The transports (afd/transport.py over torch.distributed,
afd/ipc_transport.py over CUDA IPC) differ only in how the bytes travel and how the receiver knows
they arrived.

Per MoE layer and micro-batch:
- M2N dispatch: every AG sends every EG one fixed-capacity message of `bucket` token rows: the
  hidden states (model dtype, or FP8 e4m3 with per-token 128-wide group scales), the top-k expert
  ids and routing weights. Padding rows carry expert id -1.
- N2M combine: every EG returns the weighted sum of its own experts' outputs for every row.

With tensor parallelism inside the attention lanes, only each lane's TP rank 0 exchanges with the
EGs (every lane rank holds the same tokens): the dispatch happens once per lane, not once per rank.

Every token goes to every EG rather than only to the owners of its experts: with Qwen3.5's top-8
over N <= 8 expert workers, a given EG owns one of a token's experts with probability
1 - (1 - 1/N)^8 (0.90 at N = 4), so compaction would save little, while fixed-size messages need
no size exchange and keep the path CUDA-graph capturable. Messages of one (AG, EG) pair are posted
in the same (layer, mb) order on both sides.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.layers.fp8 import dequantize_block_fp8, quantize_block_fp8

FP8_GROUP = 128


@dataclass(frozen=True)
class DispatchLayout:
    """Byte layout of one dispatch message: [hidden | fp8 scales | expert ids | weights], each segment
    contiguous so the receiver views it without copying."""

    bucket: int
    hidden: int
    top_k: int
    dtype: torch.dtype  # hidden dtype when not fp8
    fp8: bool

    @property
    def groups(self) -> int:
        return self.hidden // FP8_GROUP

    def _sizes(self) -> tuple[int, int, int, int]:
        elem = 1 if self.fp8 else torch.empty((), dtype=self.dtype).element_size()
        return (
            self.bucket * self.hidden * elem,
            self.bucket * self.groups * 4 if self.fp8 else 0,
            self.bucket * self.top_k * 4,
            self.bucket * self.top_k * 4,
        )

    @property
    def nbytes(self) -> int:
        return sum(self._sizes())

    def views(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(hidden [bucket, H], scales [bucket, G] or None, ids [bucket, k] int32, weights [bucket, k] fp32)
        of the message at the start of buf (uint8, at least nbytes)."""
        sizes = self._sizes()
        offs = [sum(sizes[:i]) for i in range(4)]
        seg = [buf[o : o + n] for o, n in zip(offs, sizes)]
        hidden = seg[0].view(torch.float8_e4m3fn if self.fp8 else self.dtype).view(self.bucket, self.hidden)
        scales = seg[1].view(torch.float32).view(self.bucket, self.groups) if self.fp8 else None
        ids = seg[2].view(torch.int32).view(self.bucket, self.top_k)
        weights = seg[3].view(torch.float32).view(self.bucket, self.top_k)
        return hidden, scales, ids, weights


@dataclass
class PendingCombine:
    works: list  # p2p: the receives to wait for (empty over IPC, where the flags say)
    partials: torch.Tensor  # [N, bucket, H]
    num_tokens: int
    mb: int


@dataclass
class PendingDispatch:
    works: list
    bufs: torch.Tensor  # [M, >= layout.nbytes] uint8
    layout: DispatchLayout
    mb: int


class Exchange:
    """One process's end of the exchange, whatever carries it. Ranks [0, M * lane_tp) are the AG
    lanes' ranks (lane i's TP rank 0, which exchanges for the lane, at i * lane_tp), [M * lane_tp,
    M * lane_tp + N) are EGs. A transport implements dispatch and combine (AG side), post_receive,
    receive and send_combine (EG side), and check."""

    def __init__(
        self, rank: int, num_ag: int, num_eg: int, hidden: int, top_k: int, dtype: torch.dtype,
        fp8_dispatch: bool, device: torch.device, lane_tp: int = 1,
    ) -> None:
        if fp8_dispatch and hidden % FP8_GROUP:
            raise ValueError(f"fp8 dispatch needs hidden_size % {FP8_GROUP} == 0, got {hidden}")
        self.rank, self.num_ag, self.num_eg = rank, num_ag, num_eg
        self.ag_ranks = [a * lane_tp for a in range(num_ag)]
        self.eg_ranks = range(num_ag * lane_tp, num_ag * lane_tp + num_eg)
        self.hidden, self.top_k, self.dtype, self.fp8 = hidden, top_k, dtype, fp8_dispatch
        self.device = device
        self._buffers: dict[tuple[str, int, int], torch.Tensor] = {}

    def layout(self, bucket: int) -> DispatchLayout:
        return DispatchLayout(bucket, self.hidden, self.top_k, self.dtype, self.fp8)

    def _buffer(self, kind: str, bucket: int, mb: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        key = (kind, bucket, mb)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(shape, dtype=dtype, device=self.device)
        return self._buffers[key]

    def pack(self, mb: int, bucket: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [T, H] with its routing as one dispatch message (uint8 [nbytes], a static buffer per
        (bucket, mb)), padded to the bucket with rows that route nowhere."""
        t = x.shape[0]
        if t > bucket:
            raise ValueError(f"{t} tokens exceed the dispatch bucket {bucket}")
        layout = self.layout(bucket)
        buf = self._buffer("ag_send", bucket, mb, (layout.nbytes,), torch.uint8)
        hidden, scales, id_view, w_view = layout.views(buf)
        if self.fp8:
            q, s = quantize_block_fp8(x.float(), (1, FP8_GROUP))
            hidden[:t], scales[:t] = q, s
            scales[t:] = 1.0
        else:
            hidden[:t] = x
        hidden[t:] = 0
        id_view[:t], id_view[t:] = ids, -1
        w_view[:t], w_view[t:] = weights, 0.0
        return buf

    def unpack(self, bufs: torch.Tensor, layout: DispatchLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All AGs' rows from their messages bufs [M, >= nbytes], concatenated into new tensors (the
        buffers may be reused once this is done): (hidden [M·bucket, H] in the model dtype, ids, weights)."""
        parts = [layout.views(bufs[a]) for a in range(self.num_ag)]
        if self.fp8:
            hidden = torch.cat([dequantize_block_fp8(h, s, (1, FP8_GROUP), self.dtype) for h, s, _, _ in parts])
        else:
            hidden = torch.cat([h for h, _, _, _ in parts])
        ids = torch.cat([i for _, _, i, _ in parts]).long()
        weights = torch.cat([w for _, _, _, w in parts])
        return hidden, ids, weights

    def check(self) -> None:
        """Raise if an exchange failed where the host could not see it (on the device). Called
        where the worker synchronises anyway: when a step retires and after a warm-up step."""
