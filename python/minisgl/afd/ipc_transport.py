"""The AG <-> EG exchange between GPUs of one host, or processes sharing one GPU, over CUDA IPC:
device-side only, with no host synchronisation per message, so a step's exchanges can be captured
in a CUDA graph. (NCCL refuses two ranks on one GPU; between nodes afd/transport.py stays.)

Buffers live in the receiver's process and senders write into their mappings: each EG holds, per
micro-batch and per AG, one dispatch buffer of the largest message any step can send (the
largest bucket; a smaller bucket's message is a prefix of it), and each AG, per micro-batch and
per EG, one combine buffer [largest bucket, H]. Beside them each receiver holds an int32 flag per
(sender, micro-batch), 16 bytes apart, and a device-resident count of the messages it has taken
from each. At start-up every rank shares its buffers and flags through torch's CUDA IPC handles
(all_gather_object over a gloo group) and maps its peers'.

Sending is a copy into the peer's mapped buffer on the current stream, then a one-warp kernel
raising the peer's flag (atomic add, release, system scope). Receiving is a kernel spinning until
the flag exceeds its count (then the count moves on), then reading (kernels/device_flags.py). The
counts stay on the device, so a replayed graph waits for new messages without the host.

Reusing a buffer needs no acknowledgement, because each (AG, EG, micro-batch) channel alternates:
the AG's dispatch of layer l, the EG's combine of layer l, the AG's dispatch of layer l + 1, and
so on through the steps. The EG writes combine l + 1 only after it received dispatch l + 1, which
the AG issued, in its stream's order, after reading combine l (the sum is a new tensor); the AG
writes dispatch l + 1 only after it received combine l, which the EG issued after unpacking
dispatch l into new tensors. So a buffer is never written while its reader still needs it. This
assumes what the protocol guarantees: every (AG, EG) pair runs the same (layer, mb) sequence, each
worker issues its exchanges on one stream, and every micro-batch joins every layer's exchange.

On one GPU without MPS the two processes' kernels time-slice, so a spinning wait holds the GPU
until its slice ends: each message costs about a time slice (a round trip of two took 4.49 ms in
benchmarks/afd_ipc_probe.py), correct but slow. Between the GPUs of one host the spins run
concurrently (6.5-8 us a round trip between two streams in the probe).

A wait that runs out (--afd-step-timeout-s) records its channel in an error word instead of
hanging; check() raises it, naming the peer, where the worker synchronises anyway.
"""
from __future__ import annotations

import socket

import torch
import torch.distributed as dist
from torch.multiprocessing.reductions import reduce_tensor

from minisgl.afd.exchange import Exchange, PendingCombine, PendingDispatch


class IpcTransport(Exchange):
    """One process's end of the exchange over CUDA IPC. What is specific to CUDA sits in three
    methods (the flag kernels, and sharing and mapping a tensor), which the CPU tests replace with
    host shared memory to check the rest over 2+2 processes."""

    def __init__(
        self, rank: int, num_ag: int, num_eg: int, hidden: int, top_k: int, dtype: torch.dtype,
        fp8_dispatch: bool, device: torch.device, num_mb: int, max_bucket: int, timeout_s: float,
        lane_tp: int = 1,
    ) -> None:
        super().__init__(rank, num_ag, num_eg, hidden, top_k, dtype, fp8_dispatch, device, lane_tp)
        self.flags_ops = self._flag_kernels()
        self.num_mb, self.max_bucket = num_mb, max_bucket
        self.timeout_s = timeout_s
        self.is_ag, self.is_eg = rank in self.ag_ranks, rank in self.eg_ranks
        # My index among my peers' senders, and my senders (the peers whose flags I wait on).
        self.me = self.ag_ranks.index(rank) if self.is_ag else rank - self.eg_ranks[0] if self.is_eg else -1
        self.senders = list(self.eg_ranks if self.is_ag else self.ag_ranks if self.is_eg else [])
        slot = self.flags_ops.FLAG_SLOT
        n = len(self.senders)
        if self.is_eg:
            self.inbox = torch.zeros(num_mb, n, self.layout(max_bucket).nbytes, dtype=torch.uint8, device=device)
        else:
            self.inbox = torch.zeros(num_mb, n, max_bucket, hidden, dtype=dtype, device=device)
        self.flags = torch.zeros(num_mb, n, slot, dtype=torch.int32, device=device)
        self.counts = torch.zeros(num_mb, n, slot, dtype=torch.int32, device=device)
        self.error = torch.zeros(slot, dtype=torch.int32, device=device)
        cuda = device.type == "cuda"
        self._error_host = torch.zeros(1, dtype=torch.int32, pin_memory=cuda)
        self._check_stream = torch.cuda.Stream(device) if cuda else None
        self.peers = self._map_peers()

    def _flag_kernels(self):
        """What raises and awaits the flags: kernels/device_flags.py (imported here: it needs triton)."""
        if self.device.type != "cuda":
            raise ValueError(f"--afd-transport ipc needs CUDA devices, got {self.device}")
        from minisgl.kernels import device_flags

        return device_flags

    def _map_peers(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Every rank shares its inbox and flags; each maps those of the ranks it sends to. Every
        rank calls this once, right after joining, so the group's creation lines up."""
        group = dist.new_group(backend="gloo")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the zeroed flags exist before any peer can raise them
        mine = None
        if self.senders:
            mine = (socket.gethostname(), self._export(self.inbox), self._export(self.flags))
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine, group=group)
        host = socket.gethostname()
        peers = {}
        for r in self.senders:  # the ranks I receive from are the ranks I send to
            their_host, inbox, flags = everyone[r]
            if their_host != host:
                raise ValueError(f"--afd-transport ipc needs every worker on one host: rank {r} is on {their_host}, "
                                 f"rank {self.rank} on {host}; use --afd-transport p2p")
            peers[r] = (self._import(inbox), self._import(flags))
        dist.barrier(group=group)  # nobody's handles are dropped before every peer has opened them
        return peers

    @staticmethod
    def _export(t: torch.Tensor) -> object:
        """A picklable handle another process of this host maps t through (torch's CUDA IPC)."""
        return reduce_tensor(t)

    @staticmethod
    def _import(handle: object) -> torch.Tensor:
        rebuild, args = handle
        return rebuild(*args)

    def _describe(self, channel: int) -> str:
        mb, sender = divmod(channel, max(1, len(self.senders)))
        what = f"the combine of expert worker {sender}" if self.is_ag else f"the dispatch of attention lane {sender}"
        return f"{what} (rank {self.senders[sender]}) for micro-batch {mb}"

    def _signal(self, peer: int, mb: int) -> None:
        self.flags_ops.signal(self.peers[peer][1][mb, self.me, :1])

    def _wait(self, mb: int, sender: int) -> None:
        self.flags_ops.wait(self.flags[mb, sender, :1], self.counts[mb, sender, :1], self.error[:1],
                            mb * len(self.senders) + sender, int(self.timeout_s * 1e9))

    def _fits(self, bucket: int) -> None:
        if bucket > self.max_bucket:
            raise ValueError(f"dispatch bucket {bucket} exceeds the largest this transport was sized for "
                             f"({self.max_bucket})")

    # -- attention-worker side ------------------------------------------------------------------
    def dispatch(
        self, mb: int, bucket: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> PendingCombine:
        """Write x [T, H] with its routing into every EG's inbox and raise its flag."""
        self._fits(bucket)
        buf = self.pack(mb, bucket, x, ids, weights)
        for r in self.eg_ranks:
            self.peers[r][0][mb, self.me, : buf.numel()].copy_(buf)
            self._signal(r, mb)
        return PendingCombine([], self.inbox[mb, :, :bucket], x.shape[0], mb)

    def combine(self, pending: PendingCombine) -> torch.Tensor:
        """Wait (on the device) for every EG's partial sum and add them up: [T, H]."""
        for e in range(self.num_eg):
            self._wait(pending.mb, e)
        return pending.partials[:, : pending.num_tokens].sum(dim=0)

    # -- expert-worker side ---------------------------------------------------------------------
    def post_receive(self, mb: int, bucket: int) -> PendingDispatch:
        self._fits(bucket)
        return PendingDispatch([], self.inbox[mb], self.layout(bucket), mb)

    def receive(self, pending: PendingDispatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Wait (on the device) for every AG's message, then unpack them: (hidden, ids, weights)."""
        for a in range(self.num_ag):
            self._wait(pending.mb, a)
        return self.unpack(pending.bufs, pending.layout)

    def send_combine(self, mb: int, bucket: int, out: torch.Tensor) -> list:
        """Write each AG its rows of the partial sums out [M·bucket, H] and raise its flag. Nothing
        to wait for afterwards: the copies are stream-ordered."""
        self._fits(bucket)
        rows = out.view(self.num_ag, bucket, self.hidden)
        for a, r in enumerate(self.ag_ranks):
            self.peers[r][0][mb, self.me, :bucket].copy_(rows[a])
            self._signal(r, mb)
        return []

    def check(self) -> None:
        """Raise if a wait timed out. The error word is read on a stream of its own: the current
        one may already hold later steps' waits, which a retiring step must not wait for."""
        if self._check_stream is None:
            self._error_host.copy_(self.error[:1])
        else:
            with torch.cuda.stream(self._check_stream):
                self._error_host.copy_(self.error[:1], non_blocking=True)
            self._check_stream.synchronize()
        code = int(self._error_host[0])
        if code:
            raise RuntimeError(f"AFD ipc exchange: {self._describe(code - 1)} did not arrive within "
                               f"{self.timeout_s:g} s (--afd-step-timeout-s): the peer died or stalled")
