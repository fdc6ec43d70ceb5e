"""The prefix cache's bookkeeping: matching, borrowing, eviction, and every page and slot back."""
from __future__ import annotations

import random

import pytest
import torch

from minisgl.kvcache.allocator import CHECKPOINT_TAIL, Admission, PoolAllocator, PoolExhausted
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.kvcache.prefix_index import PrefixEntry, PrefixIndex

PS = 4


def _entry(tokens: list[int], slot: int) -> PrefixEntry:
    return PrefixEntry(tuple(tokens), tuple(range(100 + slot * 10, 100 + slot * 10 + len(tokens) // PS)), slot)


def test_index_finds_the_longest_entry_that_leaves_a_token_to_feed() -> None:
    index = PrefixIndex(PS)
    base = list(range(20))
    assert index.insert(_entry(base[:4], 1)) and index.insert(_entry(base[:12], 2))
    assert index.insert(_entry(base[:8] + [99] * 4, 3))  # shares 8 tokens, then differs
    assert index.match(base[:13]).slot == 2
    assert index.match(base[:12]).slot == 1  # 12 cached would leave nothing to feed: the shorter one
    assert index.match(base[:8] + [99] * 4 + [5]).slot == 3
    assert index.match([7] + base[1:13]) is None
    assert not index.insert(_entry(base[:12], 4))  # one entry per prefix
    with pytest.raises(ValueError, match="whole pages"):
        index.insert(PrefixEntry(tuple(base[:6]), (1, 2), 5))


def test_index_verifies_tokens_behind_equal_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    import minisgl.kvcache.prefix_index as mod

    monkeypatch.setattr(mod, "page_hashes", lambda tokens, size, pages: iter([0] + [7] * pages))  # all collide
    index = PrefixIndex(PS)
    assert index.insert(_entry([1, 2, 3, 4], 1))
    assert index.insert(_entry([5, 6, 7, 8], 2))  # same key, other tokens: both kept
    assert index.match([9, 9, 9, 9, 9]) is None
    assert index.match([1, 2, 3, 4, 9]).slot == 1 and index.match([5, 6, 7, 8, 9]).slot == 2


def test_index_finds_where_recent_prompts_part(monkeypatch: pytest.MonkeyPatch) -> None:
    import minisgl.kvcache.prefix_index as mod

    index = PrefixIndex(PS)
    system = [7] * 9  # two whole pages and a token
    index.note(system + [1] * 6)
    assert index.shared_pages(system + [1] * 6) == 0  # alone so far
    index.note(system + [2] * 6)
    assert index.shared_pages(system + [1] * 6) == index.shared_pages(system + [2] * 6) == 2
    index.note(system + [1] * 6)  # the same prompt again: all but its last token's page
    assert index.shared_pages(system + [1] * 6) == 3 and index.shared_pages([5] * 15) == 0
    monkeypatch.setattr(mod, "RECENT_PAGES", 4)  # older prompts' pages are forgotten
    for other in ([5] * 15, [5] * 15, [6] * 15, [6] * 15):
        index.note(other)
    assert index.shared_pages([6] * 15) == 3 and index.shared_pages(system + [1] * 6) == 0


def test_a_conversation_s_next_turn_is_no_branch() -> None:
    """A prompt that continues a recent one (its conversation's last turn, which it takes over
    parked) shares all of it, but no prompt goes on differently: nothing to cache for it. Another
    that parts from it within its last, partial page does."""
    index = PrefixIndex(PS)
    last = [7] * 9 + [1] * 6  # 3 whole pages, 3 tokens into a fourth
    turns = [last, last + [3] * 8, last + [3] * 8 + [4] * 5]
    for turn in turns:
        index.note(turn)
        assert index.shared_pages(turn) == 0
    other = last[:-1] + [2] + [5] * 8  # parts from `last` at its last token
    index.note(other)
    assert index.shared_pages(other) == 3


def test_an_unshared_prefix_evicts_no_shared_one() -> None:
    """A prefix where prompts branch is proven; a chat turn's tail (cached for a next turn) is not
    until a second prompt reuses it, and goes first."""
    index = PrefixIndex(PS)
    system = [7] * 8
    shared, tail = _entry(system, 1), _entry(system + [1] * 4, 2)
    assert index.insert(shared, proven=True) and index.insert(tail)
    assert index.evictable(proven=False) and index.pop_least_recent(proven=False) is tail
    assert not index.evictable(proven=False) and index.pop_least_recent(proven=False) is None
    reused = _entry(system + [2] * 4, 3)
    index.insert(reused)
    for _ in range(2):
        assert index.match(system + [2] * 5) is reused
    assert not index.evictable(proven=False)
    assert index.pop_least_recent() is shared and index.pop_least_recent() is reused


def test_a_tail_its_next_turn_took_goes_before_one_waiting_for_its_own() -> None:
    """A chat tail that one prompt reused (its conversation's next turn, which caches a tail of its
    own) is evicted before a tail whose next turn has not come, however recently either was used."""
    index = PrefixIndex(PS)
    waiting, taken = _entry([5] * 8, 1), _entry([6] * 8, 2)
    assert index.insert(waiting) and index.insert(taken)
    assert index.match([6] * 9) is taken and index.taken_once(taken) and not index.taken_once(waiting)
    assert index.pop_least_recent(proven=False) is taken
    assert index.pop_least_recent(proven=False) is waiting


def test_parked_sequences_match_exactly_and_go_to_one_taker() -> None:
    index = PrefixIndex(PS)
    base = list(range(20))
    parked = PrefixEntry(tuple(base[:10]), (1, 2, 3), 1, parked=True)  # 2 whole pages and 2 tokens
    short = PrefixEntry(tuple(base[:3]), (4,), 2, parked=True)  # less than a page
    assert index.insert(parked) and index.insert(short) and index.insert(_entry(base[:8], 3))
    assert index.match(base[:11]) is parked  # longer than the shared 8
    assert index.match(base[:10]).slot == 3  # all 10 would leave nothing to feed
    assert index.match(base[:9] + [99, 5]).slot == 3  # diverges inside the parked tail
    assert index.match(base[:4]) is short
    index.remove(parked)
    assert index.match(base[:11]).slot == 3 and len(index) == 2
    with pytest.raises(ValueError, match="whole pages"):
        index.insert(PrefixEntry(tuple(base[:10]), (1, 2, 3), 4))


def test_index_evicts_least_recently_used_parked_first() -> None:
    index = PrefixIndex(PS)
    for slot, first in enumerate((10, 20, 30), start=1):
        index.insert(_entry([first] * 4, slot), proven=True)
    index.match([10] * 5)  # a hit makes it recent
    assert [index.pop_least_recent().slot for _ in range(3)] == [2, 3, 1]
    assert index.pop_least_recent() is None
    index.insert(_entry([40] * 4, 4), proven=True)
    index.insert(PrefixEntry((50, 51), (9,), 5, parked=True))
    index.insert(PrefixEntry((60, 61), (8,), 6, parked=True))
    assert [index.pop_least_recent().slot for _ in range(3)] == [5, 6, 4]  # parked sequences first


def _cached(alloc: PoolAllocator, prompt: list[int], reserve: int) -> tuple[int, int]:
    """Run one request through: admit, take its prompt's pages, cache at its checkpoints. Two prompts
    like it have arrived, so it stops early to cache its prefix."""
    alloc.note_prompt(prompt)
    alloc.note_prompt(prompt)
    a = alloc.admit(prompt, reserve, reuse=True)
    alloc.ensure_tokens(a.slot, len(prompt))
    for at in a.checkpoints:
        alloc.cache_prefix(a.slot, prompt[:at])
    alloc.check_integrity()
    return a.slot, a.cached


def test_a_request_borrows_a_cached_prefix_and_everything_returns() -> None:
    alloc = PoolAllocator(max_running=4, total_pages=32, page_size=PS, max_seq_len=64, prefix_cache=True)
    prompt = list(range(40, 70))  # 30 tokens: cached at (30 - tail) // 4 * 4
    at = (len(prompt) - CHECKPOINT_TAIL) // PS * PS
    a, reused = _cached(alloc, prompt, 34)
    assert reused == 0 and alloc.cached_prefixes == 1
    pages_a = alloc._pages[a][: at // PS]
    alloc.free(a)
    assert alloc.evictable_pages == at // PS and alloc.available_pages == 32
    admitted = alloc.admit(prompt[:at] + [1, 2, 3], 20, reuse=True)
    b = admitted.slot
    assert admitted.cached == at and admitted.checkpoints == () and alloc._pages[b] == pages_a  # lent, in order, before any page of its own
    assert alloc.evictable_pages == 0 and alloc.available_pages == 32 - 5  # 20 tokens = 5 pages in all
    alloc.ensure_tokens(b, 20)
    assert alloc._pages[b][: at // PS] == pages_a and len(alloc._pages[b]) == 5
    alloc.check_integrity()
    with pytest.raises(PoolExhausted, match="reserved"):
        alloc.ensure_tokens(b, 24)
    alloc.free(b)
    assert alloc.flush_cache() == 1
    alloc.check_integrity()
    assert alloc.free_pages == 32 and alloc.free_slots == 4


def test_only_a_prompt_that_begins_as_another_stops_early() -> None:
    alloc = PoolAllocator(max_running=4, total_pages=32, page_size=PS, max_seq_len=64, prefix_cache=True)
    prompt = list(range(30))
    alloc.note_prompt(prompt)
    alone = alloc.admit(prompt, 30, reuse=True)
    assert alone.checkpoints == ()  # nothing suggests it is shared: no early stop, no step lost
    alloc.note_prompt(prompt[:4] + [99] * 26)  # another prompt with the same first page
    assert alloc.admit(prompt, 30, reuse=True).checkpoints == (4,)  # where the two part
    tail = (30 - CHECKPOINT_TAIL) // PS * PS  # and, for a chat turn, where its next turn will part
    assert alloc.admit(prompt, 30, reuse=True, chat_turn=True).checkpoints == (4, tail)
    alloc.note_prompt([7] * 4)  # a page long: no first page to share (it must leave a token to feed)
    alloc.note_prompt([7] * 4)
    assert alloc.admit([7] * 4, 8, reuse=True).checkpoints == ()



def test_a_chat_turn_does_not_stop_where_it_parts_from_the_turn_it_continues() -> None:
    """Each turn of a conversation re-renders the last one's end: the last generation prompt
    (three tokens here) keeps one. A turn that reused its last turn's tail parts from that turn
    there; a stop at the page boundary before it would cache what no prompt reuses (the next
    turn reuses this one's tail). It stops only at its own tail."""
    alloc = PoolAllocator(max_running=4, total_pages=64, page_size=PS, max_seq_len=160, prefix_cache=True)
    generation = [900, 901, 902]
    prompt = list(range(10, 40)) + generation  # a system prompt and a question: 33 tokens
    tails = []
    for turn in range(4):
        alloc.note_prompt(prompt)
        admitted = alloc.admit(prompt, len(prompt) + 8, reuse=True, chat_turn=True)
        tail = (len(prompt) - CHECKPOINT_TAIL) // PS * PS
        # The first turn stops at its tail, for the next turn; each later one reused the last
        # turn's tail (the first to) and stops at its own only.
        assert admitted.cached == (tails[-1] if tails else 0) and admitted.checkpoints == (tail,)
        alloc.ensure_tokens(admitted.slot, len(prompt))
        for at in admitted.checkpoints:
            alloc.cache_prefix(admitted.slot, prompt[:at])
        alloc.free(admitted.slot)
        alloc.check_integrity()
        tails.append(tail)
        answer = [500 + turn] * 20
        prompt = prompt[:-1] + answer + [999] + [600 + turn] * 6 + generation


def test_no_reuse_where_asked_not_to_or_without_the_cache() -> None:
    with_cache = PoolAllocator(4, 32, PS, 64, prefix_cache=True)
    prompt = list(range(30))
    with_cache.free(_cached(with_cache, prompt, 30)[0])
    plain = with_cache.admit(prompt, 30, reuse=False)
    assert plain.cached == 0 and plain.checkpoints == ()  # nothing reused, nothing to cache
    without = PoolAllocator(4, 32, PS, 64)
    slot, reused = _cached(without, prompt, 30)
    assert reused == 0 and without.cached_prefixes == 0
    without.free(slot)
    assert without.admit(prompt, 30, reuse=True).cached == 0 and without.admit(prompt, 30, True).checkpoints == ()


def test_eviction_gives_pages_and_slots_to_admission() -> None:
    alloc = PoolAllocator(max_running=3, total_pages=12, page_size=PS, max_seq_len=48, prefix_cache=True)
    for first in (100, 200):
        slot, _ = _cached(alloc, [first + i for i in range(24)], 24)  # 6 pages, 2 of them cached
        alloc.free(slot)
    assert alloc.cached_prefixes == 2 and alloc.free_slots == 1 and alloc.evictable_pages == 4
    # Slots: two requests at once need an entry's slot.
    s1 = alloc.allocate(4)
    s2 = alloc.allocate(4)
    assert alloc.cached_prefixes == 1
    alloc.free(s1)
    alloc.free(s2)
    # Pages: one request of all 12 pages needs the cached pages back.
    assert alloc.can_allocate(48)
    big = alloc.allocate(48)
    alloc.ensure_tokens(big, 48)
    assert alloc.cached_prefixes == 0 and alloc.free_pages == 0
    alloc.check_integrity()
    assert not alloc.can_allocate(1)


@pytest.mark.parametrize("cache_slots", [0, 1])
def test_a_shared_prefix_stays_cached_while_every_running_slot_is_busy(cache_slots: int) -> None:
    """Full load: as many requests run as may. With a slot kept for the cache, the system prompt
    the users' prompts share outlives them, and neither their admissions nor their own tails (cached
    for a next turn, which no one has shared) evict it; without, admission evicted it."""
    alloc = PoolAllocator(max_running=2, total_pages=32, page_size=PS, max_seq_len=64, prefix_cache=True,
                          cache_slots=cache_slots)
    system = list(range(100, 124))  # a 24-token system prompt (6 pages), then each user's question
    prompts = [system + [user] * 20 for user in (1, 2, 3)]
    tail = (44 - CHECKPOINT_TAIL) // PS * PS
    for p in prompts:
        alloc.note_prompt(p)
    a = alloc.admit(prompts[0], 44, reuse=True, chat_turn=True)
    assert a.checkpoints == (24, tail)  # where the system prompt ends, and its own tail
    alloc.ensure_tokens(a.slot, 44)
    assert alloc.cache_prefix(a.slot, prompts[0][:24]) is not None
    alloc.cache_prefix(a.slot, prompts[0][:tail])
    alloc.check_integrity()
    b = alloc.admit(prompts[1], 44, reuse=True, chat_turn=True)  # the last running slot (without a cache slot: the entry's)
    assert b.cached == 24
    alloc.ensure_tokens(b.slot, 44)
    for at in b.checkpoints:
        alloc.cache_prefix(b.slot, prompts[1][:at])
    alloc.check_integrity()
    assert not alloc.can_allocate(4)  # max_running run, though a cache slot may hold an entry
    with pytest.raises(PoolExhausted, match="all 2 in use"):
        alloc.allocate(4)
    assert [e.tokens for e in alloc.cache.entries()] == [tuple(system)] * cache_slots
    alloc.free(a.slot)
    c = alloc.admit(prompts[2], 44, reuse=True, chat_turn=True)
    assert c.cached == (24 if cache_slots else 0)
    alloc.free(b.slot)
    alloc.free(c.slot)
    alloc.flush_cache()
    alloc.check_integrity()
    assert alloc.free_slots == 2 + cache_slots and alloc.free_pages == 32


def test_the_matched_entry_may_give_its_own_slot() -> None:
    alloc = PoolAllocator(max_running=2, total_pages=16, page_size=PS, max_seq_len=32, prefix_cache=True)
    prompt = list(range(28))
    holder, _ = _cached(alloc, prompt, 28)  # the entry takes the other slot
    alloc.free(holder)
    other = alloc.allocate(4)  # a free slot is gone; the entry keeps its slot
    entry_slot = alloc.cache.entries()[0].slot
    admitted, entry = alloc.admit_entry(prompt, 28, reuse=True)
    slot = admitted.slot
    assert entry is not None and slot == entry_slot and alloc.cached_prefixes == 0
    assert alloc._pages[slot] == list(entry.pages)  # the pages stay lent after the entry is gone
    alloc.check_integrity()
    alloc.free(slot)
    alloc.free(other)
    alloc.check_integrity()
    assert alloc.free_pages == 16 and alloc.free_slots == 2


def test_a_parked_sequence_is_taken_over_whole() -> None:
    alloc = PoolAllocator(max_running=3, total_pages=20, page_size=PS, max_seq_len=64, prefix_cache=True)
    fed = list(range(100, 114))  # 14 tokens: 3 whole pages and 2 tokens in a fourth
    slot = alloc.admit(fed[:10], 24, reuse=True).slot
    alloc.ensure_tokens(slot, 16)  # a page more than the fed tokens need, as an overshoot step takes
    pages = list(alloc._pages[slot])
    assert alloc.park(slot, fed) is not None
    alloc.check_integrity()
    assert alloc.cached_prefixes == 1 and alloc.free_slots == 2 and alloc.evictable_pages == 4
    assert alloc.free_pages == 16  # the fifth page went back
    admitted, entry = alloc.admit_entry(fed + [7, 7], 30, reuse=True)
    taker = admitted.slot
    assert entry is not None and entry.parked and taker == slot and alloc._pages[taker] == pages[:4]
    assert admitted == Admission(slot, 14, ())  # a continuation caches no prefix of its own: it is parked in turn
    assert alloc.cached_prefixes == 0 and alloc.evictable_pages == 0
    alloc.ensure_tokens(taker, 30)  # writes on into the partial page, then pages of its own
    alloc.check_integrity()
    other = alloc.admit(fed + [8], 16, reuse=True)
    assert other.cached == 0  # taken: nobody else continues it
    other = other.slot
    alloc.free(taker)
    alloc.free(other)
    alloc.check_integrity()
    assert alloc.free_pages == 20 and alloc.free_slots == 3


@pytest.mark.parametrize("cache_slots", [0, 2])
def test_random_traffic_keeps_the_books(cache_slots: int) -> None:
    """Random admissions (prompts sharing prefixes), growth, caching and frees, checked after every
    change; at the end every page and slot is free once the cache is emptied."""
    rng = random.Random(0)
    alloc = PoolAllocator(max_running=6, total_pages=60, page_size=PS, max_seq_len=64, prefix_cache=True,
                          cache_slots=cache_slots)
    stems = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    live: dict[int, tuple[list[int], int, int]] = {}  # slot -> prompt, reserve, tokens so far
    fed_seqs: list[list[int]] = []  # what parked slots fed
    hits = {None: 0, False: 0, True: 0}  # admissions without a hit, with a shared prefix, taking over
    checkpoints: dict[int, list[int]] = {}  # slot -> where it has yet to cache
    for _ in range(1500):
        if live and (rng.random() < 0.4 or not alloc.can_allocate(64)):
            slot = rng.choice(list(live))
            prompt, reserve, have = live[slot]
            if rng.random() < 0.5 and have < reserve:
                have = rng.randint(have, reserve)
                alloc.ensure_tokens(slot, have)
                live[slot] = (prompt, reserve, have)
                while checkpoints[slot] and have >= checkpoints[slot][0]:
                    alloc.cache_prefix(slot, prompt[: checkpoints[slot].pop(0)])
            else:
                if rng.random() < 0.5 and alloc.park(slot, (prompt + [1] * 64)[:have]) is not None:
                    fed_seqs.append((prompt + [1] * 64)[:have])
                else:
                    alloc.free(slot)
                del live[slot]
        else:
            if fed_seqs and rng.random() < 0.3:
                prompt = rng.choice(fed_seqs) + [rng.randrange(50) for _ in range(rng.randint(1, 8))]
            else:
                prompt = rng.choice(stems)[: rng.randint(6, 40)] + [rng.randrange(50) for _ in range(rng.randint(1, 8))]
            reserve = min(64, len(prompt) + rng.randint(0, 16))
            alloc.note_prompt(prompt)
            if len(prompt) < 64 and alloc.can_allocate(reserve):
                admitted, entry = alloc.admit_entry(prompt, reserve, reuse=rng.random() < 0.9,
                                                    chat_turn=rng.random() < 0.5)
                slot, reused = admitted.slot, admitted.cached
                checkpoints[slot] = list(admitted.checkpoints)
                hits[entry.parked if entry is not None else None] += 1
                assert reused < len(prompt) and (entry is None or list(entry.tokens) == prompt[:reused])
                alloc.ensure_tokens(slot, max(reused, 1))
                live[slot] = (prompt, reserve, max(reused, 1))
        alloc.check_integrity()
        assert alloc.available_pages >= 0
    for slot in list(live):
        alloc.free(slot)
    alloc.flush_cache()
    alloc.check_integrity()
    assert alloc.free_pages == 60 and alloc.free_slots == 6 + cache_slots
    assert min(hits.values()) >= 3, hits


LAYOUT = PoolLayout(full_layers=(3,), num_kv_heads=1, head_dim=2, linear_layers=(0, 1), conv_dim=3, conv_kernel=4,
                    num_value_heads=1, key_head_dim=2, value_head_dim=2)


def test_hybrid_pool_copies_the_state_and_lends_the_table_rows() -> None:
    pool = HybridPool(LAYOUT, PoolConfig(max_running_requests=3, max_seq_len=64, page_size=PS, prefix_cache=True),
                      torch.float32, "cpu")
    prompt = list(range(30))
    pool.note_prompt(prompt)
    pool.note_prompt(prompt)
    admitted = pool.admit(prompt, 32, reuse=True)
    slot, reused, (at,) = admitted.slot, admitted.cached, admitted.checkpoints
    pool.ensure_tokens(slot, 30)
    state = torch.randn_like(pool.state.ssm[:, slot]), torch.randn_like(pool.state.conv[:, slot])
    pool.state.ssm[:, slot], pool.state.conv[:, slot] = state
    assert reused == 0 and pool.cache_prefix(slot, prompt[:at])
    pool.state.ssm[:, slot].add_(1.0)  # the request goes on; the entry keeps the state at `at`
    rows = pool.page_table[pool.row(slot), : at // PS].clone()
    pool.free(slot)
    new = pool.admit(prompt[:at] + [7, 7], 40, reuse=True)
    assert new.cached == at
    new = new.slot
    assert torch.equal(pool.page_table[pool.row(new), : at // PS], rows)
    assert torch.equal(pool.state.ssm[:, new], state[0]) and torch.equal(pool.state.conv[:, new], state[1])
    pool.ensure_tokens(new, 40)
    pool.check_integrity()
    fresh = pool.admit([5] * 30, 32, reuse=True)
    assert fresh.cached == 0 and not pool.state.ssm[:, fresh.slot].any()  # no hit: zeroed as before
