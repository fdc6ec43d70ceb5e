"""Request groups for the GDN chunked rule (prefill_groups.py): the split itself, and a grouped
prefill step against the same step in one call on the tiny hybrid model (fp32, CPU).
tests/gpu/test_grouped_prefill_fla.py runs the same step on fla."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM
from minisgl.forward_batch import ForwardBatch, Snapshot
from minisgl.prefill_groups import GROUP_REQUESTS, GROUP_TOKENS, PAIR_MIN_TOKENS, PIECE_ALIGN, prefill_calls, prefill_groups
from grouped_prefill import STEPS, grouped_against_whole, one_step, rel_err, SNAPSHOT_CUTS, snapshots_against_stops
from minisgl.gdn.torch_backend import TorchGDNBackend


def test_groups_cover_every_request_in_order_within_both_bounds() -> None:
    for lens in ([1024] * 16, [1023] * 16, [3000] * 6, [100, 5000, 7, 4096, 1], [16384], [1] * 100, [4095]):
        groups = prefill_groups(lens)
        assert [i for g in groups for i in range(*g)] == list(range(len(lens)))
        for i, j in groups:
            assert j - i <= GROUP_REQUESTS and (j - i == 1 or sum(lens[i:j]) <= GROUP_TOKENS)
        for (i, j), (k, _) in zip(groups, groups[1:]):  # each closed only when the next request did not fit
            assert j - i == GROUP_REQUESTS or sum(lens[i : k + 1]) > GROUP_TOKENS
    assert prefill_groups([1024] * 16) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert prefill_groups([1023] * 16) == [(0, 4), (4, 8), (8, 12), (12, 16)]  # never above what was measured
    assert prefill_groups([1] * 40) == [(0, 16), (16, 32), (32, 40)]
    assert prefill_groups([1024] * 4) == [(0, 4)]  # one group: one call
    with pytest.raises(ValueError, match="max_requests"):
        prefill_groups([1], max_requests=0)


def _pieces(calls) -> list[list[tuple[int, int, int]]]:
    return [[(p.request, p.offset, p.length) for p in call] for call in calls]


def test_calls_cover_each_request_in_order_and_never_exceed_what_was_measured() -> None:
    """Every request's pieces tile its tokens in order, cut at PIECE_ALIGN; a call holds consecutive
    requests, at most GROUP_REQUESTS, and no more tokens than the bound or the step's longest request
    (what the unpaired groups held, and what the warm-up measured)."""
    cases = ([8192, 8192], [8000, 8000], [8191, 8190], [3000] * 6, [100, 5000, 7, 4096, 1], [16384], [1] * 100,
             [5000, 1023], [4097, 4097, 4097], [1024] * 16, [6000, 2500, 9000])
    for lens in cases:
        calls = prefill_calls(lens)
        done = [0] * len(lens)
        for call in calls:
            requests = [p.request for p in call]
            assert requests == list(range(requests[0], requests[-1] + 1)) and len(call) <= GROUP_REQUESTS
            assert sum(p.length for p in call) <= max(GROUP_TOKENS, *lens)
            for p in call:
                assert p.offset == done[p.request] and p.length > 0 and p.offset % PIECE_ALIGN == 0
                done[p.request] += p.length
        assert done == lens
    assert _pieces(prefill_calls([8192, 8192])) == [[(0, 0, 4096), (1, 0, 4096)], [(0, 4096, 4096), (1, 4096, 4096)]]
    # Cut at 3968 both, the second call would hold 8064 tokens: b's cut balances the two.
    assert _pieces(prefill_calls([8000, 8000])) == [[(0, 0, 3968), (1, 0, 4032)], [(0, 3968, 4032), (1, 4032, 3968)]]
    # Two calls of 4097 tokens each cannot both end at 64-token cuts: they run alone (as do any two
    # lone prompts of one length that is not a multiple of 64, when both exceed the bound).
    assert _pieces(prefill_calls([4097] * 3)) == [[(0, 0, 4097)], [(1, 0, 4097)], [(2, 0, 4097)]]
    assert _pieces(prefill_calls([6000, 2500, 9000])) == [[(0, 0, 2944), (1, 0, 1280)],
                                                          [(0, 2944, 3056), (1, 1280, 1220)], [(2, 0, 9000)]]
    # Only lone requests pair, and only when the shorter has PAIR_MIN_TOKENS.
    assert _pieces(prefill_calls([5000, PAIR_MIN_TOKENS - 1])) == [[(0, 0, 5000)], [(1, 0, PAIR_MIN_TOKENS - 1)]]
    assert _pieces(prefill_calls([5000, 3000, 1000])) == [[(0, 0, 5000)], [(1, 0, 3000), (2, 0, 1000)]]
    assert _pieces(prefill_calls([1024] * 8)) == [[(i, 0, 1024) for i in range(4)], [(i, 0, 1024) for i in range(4, 8)]]


def test_cuts_end_calls_and_move_no_token() -> None:
    """A snapshot's cut ends the call after the piece before it; the next call begins with the rest.
    Cuts inside a pair of halves keep the halves' token order; cuts at a request's start or end, or
    past it, are refused."""
    lens = [3000, 2600, 1500, 150, 90]
    cuts = {0: [1000], 1: [2000], 3: [100, 2], 4: [1, 64]}
    assert _pieces(prefill_calls(lens, cuts=cuts)) == [
        [(0, 0, 1000)], [(0, 1000, 472), (1, 0, 1280)], [(0, 1472, 1528), (1, 1280, 720)], [(1, 2000, 600)],
        [(2, 0, 1500), (3, 0, 2)], [(3, 2, 98)], [(3, 100, 50), (4, 0, 1)], [(4, 1, 63)], [(4, 64, 26)]]
    uncut = [p for call in prefill_calls(lens) for p in call]
    merged = [(p.request, p.offset) for call in prefill_calls(lens, cuts=cuts) for p in call if p.offset not in (
        1000, 2000, 2, 100, 1, 64)]
    assert merged == [(p.request, p.offset) for p in uncut]  # the same order of the same starts
    for bad in ({0: [0]}, {0: [3000]}, {4: [91]}):
        with pytest.raises(ValueError, match="inside"):
            prefill_calls(lens, cuts=bad)


def test_snapshots_shape_the_flows_and_keep_the_step_order() -> None:
    table = torch.zeros(6, 200, dtype=torch.int64)
    # A decode, then a fresh prompt cut twice and a continued one cut once: every call of pieces in
    # the step's order (no conv map); each cut's piece writes its final state to the snapshot's slot.
    batch = ForwardBatch.build([[1], [2] * 300, [3] * 100], [5, 0, 64], [1, 2, 3], table, 64, "cpu",
                               snapshots=[Snapshot(1, 64, 4), Snapshot(1, 128, 5), Snapshot(2, 10, 6)])
    part = batch.prefill_requests
    assert part.snapshots == (Snapshot(0, 64, 4), Snapshot(0, 128, 5), Snapshot(1, 10, 6))
    assert _pieces(part.gdn_calls) == [[(0, 0, 64)], [(0, 64, 64)], [(0, 128, 172), (1, 0, 10)], [(1, 10, 90)]]
    assert [(f.fresh, f.hand_on, f.live, f.snapshots) for f in part.state_flows] == [
        (True, True, (0,), ((0, 4),)), (False, False, (0,), ((0, 5),)), (False, False, (0, 1), ((1, 6),)),
        (False, False, (0,), ())]
    assert part.call_order is None and [g.segments for g in part.groups] == [
        ((0, 0, 64),), ((64, 0, 64),), ((128, 0, 182),), ((310, 0, 90),)]
    for bad in (Snapshot(0, 1, 4), Snapshot(1, 300, 4), Snapshot(2, 5, 0), Snapshot(3, 5, 4)):
        with pytest.raises(ValueError, match="must name"):
            ForwardBatch.build([[1], [2] * 300, [3] * 100], [5, 0, 64], [1, 2, 3], table, 64, "cpu", snapshots=[bad])


@pytest.mark.parametrize("cuts", sorted(SNAPSHOT_CUTS))
def test_snapshots_are_the_states_where_a_prefill_would_stop(tiny_checkpoints, cuts: str) -> None:
    """The prefix cache's snapshots from inside a step (halves, groups, a continued prompt, cuts
    within the conv's window of a prompt's start), and the step's logits and states, against a run
    that stops at every cut: at fp32 noise."""
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, context_length=4096)
    for what, err in snapshots_against_stops(llm.engine, cuts):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"


def test_bounds_are_read_at_each_call(monkeypatch) -> None:
    """benchmarks/bench_prefill.py --gdn-group-tokens and --lone-prompts-whole time steps under other
    bounds this way."""
    monkeypatch.setattr("minisgl.prefill_groups.GROUP_TOKENS", 2048)
    assert prefill_groups([1024] * 4) == [(0, 2), (2, 4)]
    assert _pieces(prefill_calls([3000, 2900])) == [[(0, 0, 1472), (1, 0, 1472)], [(0, 1472, 1528), (1, 1472, 1428)]]
    monkeypatch.setattr("minisgl.prefill_groups.PAIR_MIN_TOKENS", 5901)
    assert _pieces(prefill_calls([3000, 2900])) == [[(0, 0, 3000)], [(1, 0, 2900)]]


@pytest.mark.parametrize("decodes", [0, 3], ids=["prefill", "mixed"])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_prefill_in_calls_equals_one_call(tiny_checkpoints, step: str, decodes: int) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, max_running_requests=12,
              context_length=4096)
    for what, err in grouped_against_whole(llm.engine, step, decodes):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("decodes", [0, 3], ids=["prefill", "mixed"])
def test_q_and_k_normalised_in_the_conv_change_nothing_at_fp32(tiny_checkpoints, decodes: int) -> None:
    """The fla backend's prefill takes q and k L2-normalised from the conv (the rule then skips its
    norm): the same step with the torch backend asked to do so gives the same logits and states."""
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, max_running_requests=12,
              context_length=4096)
    with pytest.MonkeyPatch.context() as mp:
        results = []
        for normalise in (False, True):
            mp.setattr(TorchGDNBackend, "prefill_conv_normalises_qk", normalise)
            results.append(one_step(llm.engine, "halves", decodes))
    for what, a, b in zip(("logits", "ssm state", "conv state"), *results):
        assert rel_err(b, a) < 1e-5, f"{what}: relative error {rel_err(b, a):.2e}"


def test_state_flows_read_hand_on_and_write_only_what_is_needed() -> None:
    table = torch.zeros(5, 200, dtype=torch.int64)
    # Two lone fresh prompts as halves, then a later chunk of a third request: the first call reads
    # nothing and hands on, the second reads the handed states and writes; the third reads its slot.
    batch = ForwardBatch.build([[1] * 3000, [2] * 2600, [3] * 3000], [0, 0, 64], [1, 2, 3], table, 64, "cpu")
    assert [(f.fresh, f.hand_on, f.live) for f in batch.state_flows] == [
        (True, True, (0, 1)), (False, False, (0, 1)), (False, False, (0,))]
    # Warm-up requests on the dummy slot 0: none of their states is written.
    batch = ForwardBatch.build([[1] * 30, [2] * 20], [0, 0], [0, 4], table, 64, "cpu")
    assert [(f.fresh, f.hand_on, f.live) for f in batch.state_flows] == [(True, False, (1,))]


def test_an_engines_bound_reaches_its_batches(tiny_checkpoints) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, max_running_requests=8,
              context_length=4096)
    # An engine's own bound (a GPU warm-up may widen it: engine/device_memory.py) reaches its batches,
    # a mixed step's prefill part included; another engine in the process keeps the default.
    engine = llm.engine
    engine.gdn_group_tokens = 8192
    batch = engine.make_batch([[1], [2] * 3000, [3] * 3000, [4] * 3000], [5, 0, 0, 0], [1, 2, 3, 4])
    assert batch.gdn_group_tokens == 8192
    assert [g.extend_lens for g in batch.prefill_requests.groups] == [(3000, 3000), (3000,)]
    engine.gdn_group_tokens = None
    # Under the default bound the first two run as halves, the third alone.
    groups = engine.make_batch([[2] * 3000] * 3, [0] * 3, [2, 3, 4]).groups
    assert [g.extend_lens for g in groups] == [(1472, 1472), (1528, 1528), (3000,)]


def test_a_batch_hands_out_its_groups_once_with_their_own_offsets() -> None:
    table = torch.zeros(4, 200, dtype=torch.int64)
    batch = ForwardBatch.build([[1] * 3000, [2] * 3000, [3] * 10], [0, 0, 0], [1, 2, 3], table, 64, "cpu")
    groups = batch.groups
    assert groups is batch.groups  # the same objects for every layer (fla caches per tensor object)
    assert [(g.start, g.end, g.extend_lens) for g in groups] == [(0, 3000, (3000,)), (3000, 6010, (3000, 10))]
    assert [g.cu_seqlens.tolist() for g in groups] == [[0, 3000], [0, 3000, 3010]]
    assert [g.slots.tolist() for g in groups] == [[1], [2, 3]]
    assert [g.segments for g in groups] == [((0, 0, 3000),), ((3000, 0, 3010),)]  # one copy of each output
    assert batch.call_order is None  # the calls' order is the step's: the conv writes in place
    assert ForwardBatch.build([[1] * 5] * 3, [0] * 3, [1, 2, 3], table, 64, "cpu").groups == ()


def test_a_batch_of_halves_maps_rows_both_ways() -> None:
    """Two lone requests of 3000 and 2600 tokens as halves [1472 | 1280] then [1528 | 1320], and a
    third alone: each call's rows follow the last, the outputs go back to the step's rows, and the
    two maps are each other's inverse."""
    table = torch.zeros(4, 200, dtype=torch.int64)
    batch = ForwardBatch.build([[1] * 3000, [2] * 2600, [3] * 3000], [0, 0, 0], [1, 2, 3], table, 64, "cpu")
    groups = batch.groups
    assert [(g.start, g.end, g.extend_lens) for g in groups] == [(0, 2752, (1472, 1280)), (2752, 5600, (1528, 1320)),
                                                                 (5600, 8600, (3000,))]
    assert [g.cu_seqlens.tolist() for g in groups] == [[0, 1472, 2752], [0, 1528, 2848], [0, 3000]]
    assert [g.slots.tolist() for g in groups] == [[1, 2], [1, 2], [3]]
    assert [g.segments for g in groups] == [((0, 0, 1472), (3000, 1472, 1280)), ((1472, 0, 1528), (4280, 1528, 1320)),
                                            ((5600, 0, 3000),)]
    order = batch.call_order
    assert order.rows.dtype == torch.int32 and order.sources.dtype == torch.int64
    rows, sources = order.rows.long(), order.sources
    assert sorted(sources.tolist()) == list(range(8600))
    assert torch.equal(rows[sources], torch.arange(8600)) and torch.equal(sources[rows], torch.arange(8600))
    assert sources[1470:1474].tolist() == [1470, 1471, 3000, 3001]
    assert sources[2750:2754].tolist() == [4278, 4279, 1472, 1473]


def test_whole_step_groups_only_where_their_memory_is_a_small_share() -> None:
    """engine/device_memory.py's rule on the growths the thirteenth and fourteenth sessions measured:
    the 35B's ~0.7 GiB of the ~105 GiB its weights leave is taken, the 122B's ~1.4 of ~24 is not."""
    from minisgl.engine.device_memory import WIDE_GROUP_SHARE, wide_groups_pay

    gib = 1 << 30
    assert wide_groups_pay(int(0.7 * gib), 105 * gib)
    assert not wide_groups_pay(int(1.4 * gib), 24 * gib)
    room = 50 * gib
    assert wide_groups_pay(int(WIDE_GROUP_SHARE * room), room)
    assert not wide_groups_pay(int(WIDE_GROUP_SHARE * room) + 1, room)
