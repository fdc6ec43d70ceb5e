"""Request groups for the GDN chunked rule (prefill_groups.py): the split itself, and a grouped
prefill step against the same step in one call on the tiny hybrid model (fp32, CPU).
tests/gpu/test_grouped_prefill_fla.py runs the same step on fla."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM
from minisgl.forward_batch import ForwardBatch
from minisgl.prefill_groups import GROUP_TOKENS, prefill_groups
from grouped_prefill import grouped_against_whole


def test_groups_cover_every_request_in_order_and_at_most_four() -> None:
    for lens in ([1024] * 16, [3000] * 6, [100, 5000, 7, 4096, 1], [16384], [1] * 40000, [4095]):
        groups = prefill_groups(lens)
        assert [i for g in groups for i in range(*g)] == list(range(len(lens)))
        assert 1 <= len(groups) <= 4
        target = max(GROUP_TOKENS, -(-sum(lens) // 4))
        assert all(sum(lens[i:j]) >= target for i, j in groups[:-1])
        assert all(sum(lens[i:j - 1]) < target for i, j in groups)  # closed as soon as it reached the target
    assert prefill_groups([1024] * 16) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert prefill_groups([1024] * 4) == [(0, 4)]  # at most GROUP_TOKENS: one call
    with pytest.raises(ValueError, match="max_groups"):
        prefill_groups([1], max_groups=0)


def test_grouped_prefill_equals_one_call(tiny_checkpoints) -> None:
    llm = LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", page_size=16, max_running_requests=8,
              context_length=4096)
    for what, err in grouped_against_whole(llm.engine):
        assert err < 1e-5, f"{what}: relative error {err:.2e}"


def test_only_the_step_is_split_not_its_groups() -> None:
    table = torch.zeros(6, 200, dtype=torch.int64)
    batch = ForwardBatch.build([[1] * 4096] * 5, [0] * 5, [1, 2, 3, 4, 5], table, 64, "cpu")
    # Target 5,120 (a quarter of the step); a group of 8,192 tokens would split again on its own.
    assert [g.extend_lens for g in batch.groups] == [(4096, 4096), (4096, 4096), (4096,)]
    assert all(g.groups == () for g in batch.groups)
    assert len(ForwardBatch.build([[1] * 4096] * 2, [0] * 2, [1, 2], table, 64, "cpu").groups) == 2
