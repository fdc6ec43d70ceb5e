"""How a lane's requests are split into micro-batches (`--afd-mb-split`).

- "count": contiguous runs of the running list, sizes differing by at most one.
- "context": the same sizes, but requests are dealt so each micro-batch's total attention context
  (prefix + extend, what a full-attention layer reads) is balanced. The running list is in
  admission order, so the oldest (longest) requests sit together and a count split puts them in
  one micro-batch: its full-attention layers then stall the ping-pong (docs/afd_layer_imbalance.md).

Pure Python, so the pipeline simulator partitions exactly as the coordinator does.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")
MB_SPLITS = ("count", "context")


def _sizes(n: int, parts: int) -> list[int]:
    q, r = divmod(n, parts)
    return [q + (i < r) for i in range(parts)]


def split_by_count(items: Sequence[T], parts: int) -> list[list[T]]:
    out, start = [], 0
    for n in _sizes(len(items), parts):
        out.append(list(items[start : start + n]))
        start += n
    return out


def split_by_context(items: Sequence[T], contexts: Sequence[int], parts: int) -> list[list[T]]:
    """Longest first, each to the micro-batch with the least context that still has room (LPT under
    the count split's sizes, so GDN and expert work stay as even as before). Each micro-batch keeps
    its requests in their original order."""
    if len(items) != len(contexts):
        raise ValueError(f"{len(items)} items but {len(contexts)} contexts")
    room = _sizes(len(items), parts)
    load = [0] * parts
    chosen: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(items)), key=lambda i: -contexts[i]):
        mb = min((p for p in range(parts) if room[p]), key=lambda p: (load[p], p))
        room[mb] -= 1
        load[mb] += contexts[i]
        chosen[mb].append(i)
    return [[items[i] for i in sorted(idx)] for idx in chosen]


def split(items: Sequence[T], contexts: Sequence[int], parts: int, how: str) -> list[list[T]]:
    if how == "count":
        return split_by_count(items, parts)
    if how == "context":
        return split_by_context(items, contexts, parts)
    raise ValueError(f"micro-batch split must be one of {MB_SPLITS}, got {how!r}")
