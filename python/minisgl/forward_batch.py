"""The per-step batch every backend reads: a flat ("varlen") token dimension over requests of
different lengths, with their positions, state slots and page-table rows.

A request in the batch extends its sequence by `extend_lens[i]` tokens after `prefix_lens[i]`
already-cached ones; a decode request is an extend of one. Built once per step, read by every layer.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from minisgl.host_copy import to_device
from minisgl.prefill_groups import Piece, prefill_calls


@dataclass(frozen=True)
class RequestGroup:
    """One call of the GDN chunked rule over pieces of consecutive requests (prefill_groups.py): its
    rows [start, end) in the calls' order, the pieces' cu_seqlens from 0, slots and lengths, and
    `segments`, (row in the step, row in the call, tokens) for each run of the call's rows that is
    consecutive in the step: where its output goes."""

    start: int
    end: int
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    extend_lens: tuple[int, ...]
    segments: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class CallOrder:
    """A step's tokens in its GDN calls' order, where that is not the step's (a pair of halves):
    `rows` [T] int32, each token's row in that order (the conv writes there); `sources` [T] int64,
    the step row of each row in that order (the gates are gathered by it)."""

    rows: torch.Tensor
    sources: torch.Tensor


@dataclass(frozen=True)
class Snapshot:
    """The prefix cache keeps request `request`'s recurrent state after the first `offset` tokens of
    its extend (0 < offset < the extend) in state slot `slot`: the step writes it there as it passes
    that point (gdn/prefill_states.py), so the prefill need not stop there for it."""

    request: int
    offset: int
    slot: int


@dataclass(frozen=True)
class StateFlow:
    """Where a GDN chunked-rule call's recurrent states come from and go (host facts of the step):
    `fresh`, every piece starts its request (no cached prefix, first piece): zeros in, nothing read
    from the pool; `hand_on`, the next call continues exactly these requests in this order (a pair
    of halves): the final states go to it, not through the pool; `live`, the call's requests on a
    real slot (the dummy slot 0 of the warm-up keeps its contents): whose final states the pool takes;
    `snapshots`, (piece of the call, slot) for each piece that ends at a Snapshot: its final state
    goes to that slot as well."""

    fresh: bool
    hand_on: bool
    live: tuple[int, ...]
    snapshots: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [B + 1] int32, query tokens per request
    seq_lens: torch.Tensor  # [B] int32, prefix + extend
    slots: torch.Tensor  # [B] int64, state slot (and table row = slot - 1)
    table_rows: torch.Tensor  # [B] int64
    cache_loc: torch.Tensor  # [T] int64, flat KV index where each new token's K/V is written
    logit_idx: torch.Tensor  # [B] int64, flat index of each request's last token
    # Host copies for the torch reference backends, which loop over requests.
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    slot_ids: tuple[int, ...] = ()  # host copy of `slots`: what a TP step message names (engine/tp_group.py)
    # A mixed step (the scheduler puts decodes first): its leading one-token requests, which the
    # GDN and attention layers run through their decode kernels (in place on the pool), and the
    # requests after them as a batch of their own for the prefill kernels (fresh tensors, not
    # slices: a slice at an odd offset would be a new pointer alignment, a new Triton variant).
    leading_decodes: int = 0
    prefill_part: "ForwardBatch | None" = None
    # The bound on a GDN group's tokens (prefill_groups.py) the engine measured its reserve with;
    # None: the module's.
    gdn_group_tokens: int | None = None
    # States the prefix cache keeps from inside the step; a mixed step's prefill part holds them
    # counted among its own requests.
    snapshots: tuple[Snapshot, ...] = ()

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.extend_lens)

    @functools.cached_property
    def gdn_calls(self) -> list[tuple[Piece, ...]]:
        """The GDN chunked rule's calls as pieces of the requests (prefill_groups.prefill_calls), cut
        at the snapshots."""
        cuts: dict[int, list[int]] = {}
        for s in self.snapshots:
            cuts.setdefault(s.request, []).append(s.offset)
        return prefill_calls(self.extend_lens, self.gdn_group_tokens, cuts=cuts)

    @functools.cached_property
    def groups(self) -> tuple[RequestGroup, ...]:
        """The calls of the GDN chunked rule (prefill_groups.py); () when the step is one call. Made
        on first use, the same objects for every layer of the step; whole requests' metadata comes
        from the batch's device tensors without a host copy."""
        if len(self.gdn_calls) == 1:
            return ()
        starts = [0, *itertools.accumulate(self.extend_lens)]
        groups, row = [], 0
        for call in self.gdn_calls:
            i, j = call[0].request, call[-1].request + 1
            lens = tuple(p.length for p in call)
            if self._whole(call):
                cu = self.cu_seqlens[i : j + 1] - self.cu_seqlens[i]
            else:
                cu = to_device([0, *itertools.accumulate(lens)], torch.int32, self.cu_seqlens.device)
            segments: list[tuple[int, int, int]] = []
            at = 0
            for p in call:
                step_row = starts[p.request] + p.offset
                if segments and segments[-1][0] + segments[-1][2] == step_row:
                    s, c, n = segments.pop()
                    segments.append((s, c, n + p.length))
                else:
                    segments.append((step_row, at, p.length))
                at += p.length
            groups.append(RequestGroup(row, row + at, cu, self.slots[i:j], lens, tuple(segments)))
            row += at
        return tuple(groups)

    @functools.cached_property
    def state_flows(self) -> tuple[StateFlow, ...]:
        """One StateFlow per call of gdn_calls."""
        calls = self.gdn_calls
        flows = []
        for i, call in enumerate(calls):
            nxt = calls[i + 1] if i + 1 < len(calls) else ()
            hand_on = len(nxt) == len(call) and all(
                q.request == p.request and q.offset == p.offset + p.length for p, q in zip(call, nxt))
            fresh = all(p.offset == 0 and self.prefix_lens[p.request] == 0 for p in call)
            live = tuple(j for j, p in enumerate(call) if self.slot_ids[p.request] != 0)
            snapshots = tuple((j, s.slot) for j, p in enumerate(call) for s in self.snapshots
                              if s.request == p.request and s.offset == p.offset + p.length)
            flows.append(StateFlow(fresh, hand_on, live, snapshots))
        return tuple(flows)

    def _whole(self, call: tuple[Piece, ...]) -> bool:
        return all(p.offset == 0 and p.length == self.extend_lens[p.request] for p in call)

    @functools.cached_property
    def call_order(self) -> CallOrder | None:
        """The calls' order of the tokens, None where it is the step's own (the pieces follow one
        another: whole requests, or requests cut only at snapshots)."""
        pieces = [(p.request, p.offset) for call in self.gdn_calls for p in call]
        if pieces == sorted(pieces):
            return None
        runs = [(s, n) for g in self.groups for s, _, n in g.segments]
        sources = torch.cat([torch.arange(s, s + n) for s, n in runs])
        rows = torch.empty_like(sources)
        rows[sources] = torch.arange(len(sources))
        device = self.cu_seqlens.device
        return CallOrder(to_device(rows, torch.int32, device), to_device(sources, torch.int64, device))

    @property
    def prefill_requests(self) -> "ForwardBatch":
        """The requests after the leading decodes: the whole batch when there are none."""
        return self.prefill_part or self

    @staticmethod
    def build(
        tokens: list[list[int]],
        prefix_lens: list[int],
        slots: list[int],
        page_table: torch.Tensor,
        page_size: int,
        device: torch.device | str,
        gdn_group_tokens: int | None = None,
        snapshots: Sequence[Snapshot] = (),
    ) -> "ForwardBatch":
        if not (len(tokens) == len(prefix_lens) == len(slots)) or not tokens:
            raise ValueError("a batch needs one token list, prefix length and slot per request, and >= 1 request")
        if any(len(t) == 0 for t in tokens):
            raise ValueError("every request in a batch must extend by at least one token")
        extend = [len(t) for t in tokens]
        for s in snapshots:
            if not (0 <= s.request < len(extend) and 0 < s.offset < extend[s.request] and s.slot > 0):
                raise ValueError(f"{s} must name one of the batch's {len(extend)} requests, a point inside its "
                                 f"extend and a real slot")
        flat = [tok for t in tokens for tok in t]
        positions = [p for start, n in zip(prefix_lens, extend) for p in range(start, start + n)]
        cu = [0]
        for n in extend:
            cu.append(cu[-1] + n)
        # Slot s owns table row s - 1; the dummy slot 0 (padding, warm-up) reads the dummy last row.
        rows = [s - 1 if s > 0 else page_table.shape[0] - 1 for s in slots]
        token_rows = [r for r, n in zip(rows, extend) for _ in range(n)]
        decodes = next((i for i, n in enumerate(extend) if n != 1), len(extend))
        if decodes == len(extend):  # a decode step: nothing to split
            decodes = 0
        # A snapshot's request extends by at least 2 tokens: never one of the leading decodes.
        rest = ForwardBatch.build(tokens[decodes:], prefix_lens[decodes:], slots[decodes:], page_table, page_size,
                                  device, gdn_group_tokens,
                                  [replace(s, request=s.request - decodes) for s in snapshots]) if decodes else None
        i64 = torch.int64
        pos_t = to_device(positions, i64, device)
        pages = page_table[to_device(token_rows, i64, device), pos_t // page_size].to(i64)
        return ForwardBatch(
            input_ids=to_device(flat, i64, device),
            positions=pos_t,
            cu_seqlens=to_device(cu, torch.int32, device),
            seq_lens=to_device([p + n for p, n in zip(prefix_lens, extend)], torch.int32, device),
            slots=to_device(slots, i64, device),
            table_rows=to_device(rows, i64, device),
            cache_loc=pages * page_size + pos_t % page_size,
            logit_idx=to_device([c - 1 for c in cu[1:]], i64, device),
            prefix_lens=tuple(prefix_lens),
            extend_lens=tuple(extend),
            slot_ids=tuple(slots),
            leading_decodes=decodes,
            prefill_part=rest,
            gdn_group_tokens=gdn_group_tokens,
            snapshots=tuple(snapshots),
        )
