"""Which requests of a prefill step go through the GDN chunked delta rule together.

The rule's intermediates grow with the tokens (per 64-token chunk and value head a K x V state,
plus w, u, A and the output: ~0.1 MiB a token at 122B shapes, 1.8 GiB at 16K tokens) and with the
requests (each one's state gathered in, and its final state out: 12 MiB a request at 122B shapes).
The memory planner reserves the largest step's measured peak, so an unbounded call would make
every pool smaller, or a step of many short prompts run out of memory. Consecutive requests go
through the rule in groups of at most GROUP_TOKENS tokens (a longer request alone) and at most
GROUP_REQUESTS requests; each request's arithmetic is unchanged. The warm-up measures a step of
full groups of both kinds (engine/warmup.py). On a GPU an engine may take groups of its whole step
budget instead, where that grows the largest steps' measured peak by a small share of its memory
(engine/device_memory.py): one group then gives fla's recurrence several sequences at once. Its
batches carry that bound (ForwardBatch.gdn_group_tokens); GROUP_TOKENS stays the default.

A request longer than the bound runs alone, and fla's recurrence then walks its chunks one after
another with a single sequence's heads over the SMs. Two such requests in a row run instead as two
calls of both requests' halves (prefill_calls): the recurrence has both sequences' heads at once, as
in one group of both, and no call holds more tokens than the bound or the longer request, the most a
call of the groups could hold.

A request whose state the prefix cache keeps at a point inside the step (a snapshot: the state after
a prefix of it, ForwardBatch.snapshots) is cut there too: the call ends with the piece before the cut,
whose final state is the snapshot, and the next call begins with the rest. A cut splits a call in
two; it moves no token, so the calls' token order is the one the pieces had without it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

GROUP_TOKENS = 4096
GROUP_REQUESTS = 16
# fla's chunk length. A request cut at multiples of it from its first token is chunked by the rule
# exactly as when whole. Between the calls its state waits in the pool: with the default fp32 pool
# that is the state fla carries between chunks, so the pieces compute what the whole request would;
# a bf16 pool (--mamba-ssm-dtype) rounds it there, as it does at every chunked-prefill boundary.
PIECE_ALIGN = 64
# Two lone requests pair up only when the shorter has at least this many tokens: a pair moves each
# request's state in and out once more (~10 us a request and layer at 122B shapes), and saves about
# the shorter one's chunks of sequential recurrence (~3.5 us each: docs/benchmarks.md, 2026-12-04).
PAIR_MIN_TOKENS = 1024


@dataclass(frozen=True)
class Piece:
    """Tokens [offset, offset + length) of the extend of the batch's request `request`."""

    request: int
    offset: int
    length: int


def prefill_groups(extend_lens: Sequence[int], max_tokens: int | None = None,
                   max_requests: int | None = None) -> list[tuple[int, int]]:
    """Consecutive request ranges [i, j) covering every request, each of at most max_requests
    requests and at most max_tokens tokens unless it is one request (by default the module's
    bounds, read at each call so that benchmarks/bench_prefill.py can try others)."""
    max_tokens = GROUP_TOKENS if max_tokens is None else max_tokens
    max_requests = GROUP_REQUESTS if max_requests is None else max_requests
    if max_tokens < 1 or max_requests < 1:
        raise ValueError(f"max_tokens and max_requests must be >= 1, got {max_tokens}, {max_requests}")
    groups: list[tuple[int, int]] = []
    start, tokens = 0, 0
    for i, n in enumerate(extend_lens):
        if i > start and (tokens + n > max_tokens or i - start == max_requests):
            groups.append((start, i))
            start, tokens = i, 0
        tokens += n
    if extend_lens:
        groups.append((start, len(extend_lens)))
    return groups


def prefill_calls(extend_lens: Sequence[int], max_tokens: int | None = None,
                  max_requests: int | None = None,
                  cuts: Mapping[int, Sequence[int]] | None = None) -> list[tuple[Piece, ...]]:
    """The chunked rule's calls in order, each a tuple of pieces of consecutive requests: the groups
    of prefill_groups, whole, except that two consecutive groups of one request each become two
    calls of the two requests' halves (_halves), and each call split after the piece that ends at a
    cut (`cuts`: request -> offsets into its extend, 0 < offset < its length). Every request's pieces
    come in order."""
    max_tokens = GROUP_TOKENS if max_tokens is None else max_tokens
    groups = prefill_groups(extend_lens, max_tokens, max_requests)
    calls: list[tuple[Piece, ...]] = []
    i = 0
    while i < len(groups):
        pair = _halves(groups[i], groups[i + 1], extend_lens, max_tokens) if i + 1 < len(groups) else None
        if pair is not None:
            calls += pair
            i += 2
            continue
        start, end = groups[i]
        calls.append(tuple(Piece(r, 0, extend_lens[r]) for r in range(start, end)))
        i += 1
    return _cut(calls, cuts or {}, extend_lens)


def _cut(calls: list[tuple[Piece, ...]], cuts: Mapping[int, Sequence[int]],
         extend_lens: Sequence[int]) -> list[tuple[Piece, ...]]:
    """`calls` with each piece that spans a cut split there, the call ending after its first part."""
    for request, offsets in cuts.items():
        if not all(0 < at < extend_lens[request] for at in offsets):
            raise ValueError(f"request {request}'s cuts {tuple(offsets)} must lie inside its "
                             f"{extend_lens[request]} tokens")
    out: list[tuple[Piece, ...]] = []
    for call in calls:
        current: list[Piece] = []
        for p in call:
            at = p.offset
            for c in sorted(cuts.get(p.request, ())):
                if p.offset < c < p.offset + p.length:
                    out.append((*current, Piece(p.request, at, c - at)))
                    current, at = [], c
            current.append(Piece(p.request, at, p.offset + p.length - at))
        out.append(tuple(current))
    return out


def _halves(first: tuple[int, int], second: tuple[int, int], extend_lens: Sequence[int],
            max_tokens: int) -> list[tuple[Piece, ...]] | None:
    """Requests a and b, each a group alone, as [a's first half, b's first half] then their second
    halves, or None: a group of more than one request, a request shorter than PAIR_MIN_TOKENS, or no
    cuts at PIECE_ALIGN that keep both calls within the bound or the longer request (two of 4097
    tokens, say). b's cut balances the calls against a's."""
    (a, a_end), (b, b_end) = first, second
    if a_end - a != 1 or b_end - b != 1:
        return None
    na, nb = extend_lens[a], extend_lens[b]
    if min(na, nb) < PAIR_MIN_TOKENS:
        return None
    cap = max(max_tokens, na, nb)
    ha = na // 2 // PIECE_ALIGN * PIECE_ALIGN
    low = ((na + nb) // 2 - ha) // PIECE_ALIGN * PIECE_ALIGN
    for hb in (low, low + PIECE_ALIGN):
        if 0 < hb < nb and ha + hb <= cap and na + nb - ha - hb <= cap:
            return [(Piece(a, 0, ha), Piece(b, 0, hb)), (Piece(a, ha, na - ha), Piece(b, hb, nb - hb))]
    return None
