"""The per-step batch every backend reads: a flat ("varlen") token dimension over requests of
different lengths, with their positions, state slots and page-table rows.

A request in the batch extends its sequence by `extend_lens[i]` tokens after `prefix_lens[i]`
already-cached ones; a decode request is an extend of one. Built once per step, read by every layer.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

from minisgl.host_copy import to_device
from minisgl.prefill_groups import prefill_groups


@dataclass(frozen=True)
class RequestGroup:
    """Consecutive requests of a batch: its tokens [start, end), their cu_seqlens from 0, slots and
    lengths."""

    start: int
    end: int
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    extend_lens: tuple[int, ...]


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
    def groups(self) -> tuple[RequestGroup, ...]:
        """The requests in groups for the GDN chunked rule (prefill_groups.py); () when they make
        one group. Made on first use, from the batch's device tensors without a host copy, and the
        same objects for every layer of the step."""
        spans = prefill_groups(self.extend_lens, self.gdn_group_tokens)
        if len(spans) == 1:
            return ()
        starts = [0, *itertools.accumulate(self.extend_lens)]
        return tuple(RequestGroup(starts[i], starts[j], self.cu_seqlens[i : j + 1] - self.cu_seqlens[i],
                                  self.slots[i:j], self.extend_lens[i:j]) for i, j in spans)

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
    ) -> "ForwardBatch":
        if not (len(tokens) == len(prefix_lens) == len(slots)) or not tokens:
            raise ValueError("a batch needs one token list, prefix length and slot per request, and >= 1 request")
        if any(len(t) == 0 for t in tokens):
            raise ValueError("every request in a batch must extend by at least one token")
        extend = [len(t) for t in tokens]
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
        rest = ForwardBatch.build(tokens[decodes:], prefix_lens[decodes:], slots[decodes:], page_table, page_size,
                                  device, gdn_group_tokens) if decodes else None
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
        )
