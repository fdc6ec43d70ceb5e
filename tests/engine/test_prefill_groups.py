"""Request groups for the GDN chunked rule (prefill_groups.py): the split itself, and a grouped
prefill step against the same step in one call on the tiny hybrid model (fp32, CPU).
tests/gpu/test_grouped_prefill_fla.py runs the same step on fla."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM
from minisgl.forward_batch import ForwardBatch
from minisgl.prefill_groups import GROUP_REQUESTS, GROUP_TOKENS, prefill_groups
from grouped_prefill import grouped_against_whole


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


def test_bounds_are_read_at_each_call(monkeypatch) -> None:
    """benchmarks/bench_prefill.py --gdn-group-tokens times steps under other bounds this way."""
    monkeypatch.setattr("minisgl.prefill_groups.GROUP_TOKENS", 2048)
    assert prefill_groups([1024] * 4) == [(0, 2), (2, 4)]


def test_grouped_prefill_equals_one_call(tiny_checkpoints) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, max_running_requests=8,
              context_length=4096)
    for what, err in grouped_against_whole(llm.engine):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"
    # An engine's own bound (a GPU warm-up may widen it: engine/device_memory.py) reaches its batches,
    # a mixed step's prefill part included; another engine in the process keeps the default.
    engine = llm.engine
    engine.gdn_group_tokens = 8192
    batch = engine.make_batch([[1], [2] * 3000, [3] * 3000, [4] * 3000], [5, 0, 0, 0], [1, 2, 3, 4])
    assert batch.gdn_group_tokens == 8192
    assert [g.extend_lens for g in batch.prefill_requests.groups] == [(3000, 3000), (3000,)]
    engine.gdn_group_tokens = None
    assert [g.extend_lens for g in engine.make_batch([[2] * 3000] * 3, [0] * 3, [2, 3, 4]).groups] == [(3000,)] * 3


def test_a_batch_hands_out_its_groups_once_with_their_own_offsets() -> None:
    table = torch.zeros(4, 200, dtype=torch.int64)
    batch = ForwardBatch.build([[1] * 3000, [2] * 3000, [3] * 10], [0, 0, 0], [1, 2, 3], table, 64, "cpu")
    groups = batch.groups
    assert groups is batch.groups  # the same objects for every layer (fla caches per tensor object)
    assert [(g.start, g.end, g.extend_lens) for g in groups] == [(0, 3000, (3000,)), (3000, 6010, (3000, 10))]
    assert [g.cu_seqlens.tolist() for g in groups] == [[0, 3000], [0, 3000, 3010]]
    assert [g.slots.tolist() for g in groups] == [[1], [2, 3]]
    assert ForwardBatch.build([[1] * 5] * 3, [0] * 3, [1, 2, 3], table, 64, "cpu").groups == ()


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
