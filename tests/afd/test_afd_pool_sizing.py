"""Sizing the AFD attention workers' pools from made-up figures (afd/pool_sizing.py): a device's
budget less every worker's largest step there, split between the attention workers on it; a lane's
TP ranks planning from the tightest one; the refusal naming what would fit. Expected sizes are
worked out by hand below each case."""
from __future__ import annotations

import pytest

from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import largest_bucket
from minisgl.afd.pool_sizing import ProbePeaks, WorkerMemory, plan_lane, probe_steps
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.kvcache.planner import PoolCosts, PoolDoesNotFit

M = 1_000_000
COSTS = PoolCosts(slot_bytes=1 * M, row_bytes=100_000, page_bytes=200_000, page_size=16)  # 256 tokens: 16 pages


def _attn(name: str, lane: int, device: str, free: int, reserve: int, costs: PoolCosts = COSTS) -> WorkerMemory:
    return WorkerMemory(name, lane, device, free, reserve, costs)


def _expert(name: str, device: str, free: int, reserve: int) -> WorkerMemory:
    return WorkerMemory(name, None, device, free, reserve)


def _plan(figures: list[WorkerMemory], lane: int = 0):
    return plan_lane(figures, lane, fraction=0.5, model_max_len=4096, context_length=256, max_running_requests=16,
                     state_ratio=0.9)


def test_one_plus_one_on_one_gpu_reserves_the_expert_workers_step() -> None:
    # (100M free - 10M attention step - 20M expert step) x 0.5 = 35M. 16 slots x 1.1M = 17.6M;
    # (35M - 17.6M) // 0.2M = 87 pages (fewer than 16 x 16 at 256 tokens: lowered).
    pool = _plan([_attn("attn0", 0, "gpu0", 100 * M, 10 * M), _expert("expert0", "gpu0", 100 * M, 20 * M)])
    assert pool.share.usable == 35 * M
    assert (pool.plan.max_running_requests, pool.plan.num_pages, pool.plan.max_seq_len) == (16, 87, 256)
    line = pool.describe()
    assert "AFD lane 0 memory" in line and "shared by attn0, expert0" in line and "87 pages" in line, line


def test_attention_workers_sharing_a_gpu_split_it() -> None:
    # (100M - 10M - 10M - 20M) x 0.5 = 30M, halved: 15M each. 16 slots and one request's 16 pages
    # would take 20.8M, so slots drop to (15M - 3.2M) // 1.1M = 10; pages (15M - 11M) // 0.2M = 20.
    figures = [_attn("attn0", 0, "gpu0", 100 * M, 10 * M), _attn("attn1", 1, "gpu0", 100 * M, 10 * M),
               _expert("expert0", "gpu0", 100 * M, 20 * M)]
    for lane in (0, 1):
        pool = _plan(figures, lane)
        assert pool.share.usable == 15 * M and pool.share.attention_workers == 2
        assert (pool.plan.max_running_requests, pool.plan.num_pages) == (10, 20)


def test_a_lanes_ranks_plan_from_the_tightest_one() -> None:
    # Rank 0: (100M - 10M) x 0.5 = 45M; rank 1: (60M - 10M) x 0.5 = 25M, and its decode row costs
    # 0.3M. From 25M at 1.3M a slot: 16 slots take 20.8M, pages (25M - 20.8M) // 0.2M = 21.
    costlier = PoolCosts(1 * M, 300_000, 200_000, 16)
    figures = [_attn("attn0", 0, "gpu0", 100 * M, 10 * M), _attn("attn0.tp1", 0, "gpu1", 60 * M, 10 * M, costlier),
               _expert("expert0", "gpu2", 100 * M, 20 * M)]
    pool = _plan(figures)
    assert pool.share.sharers == ("attn0.tp1",) and pool.share.usable == 25 * M
    assert pool.costs.row_bytes == 300_000
    assert (pool.plan.max_running_requests, pool.plan.num_pages) == (16, 21)


def test_refusal_says_what_would_fit_and_who_shares_the_gpu() -> None:
    # (5M - 1M - 1M) x 0.5 = 1.5M; one request of 256 tokens needs 1.1M + 3.2M. Beside one slot
    # (1.1M), 0.4M holds 2 pages: 32 tokens.
    figures = [_attn("attn0", 0, "gpu0", 5 * M, 1 * M), _expert("expert0", "gpu0", 5 * M, 1 * M)]
    with pytest.raises(PoolDoesNotFit, match=r"AFD lane 0: not even one request of 256 tokens fits.*"
                                             r"at most --context-length 32 would fit.*shared by attn0, expert0"):
        _plan(figures)


def test_figures_must_match_the_role() -> None:
    with pytest.raises(ValueError, match="attn0: an attention worker"):
        WorkerMemory("attn0", 0, "gpu0", M, M)
    with pytest.raises(ValueError, match="no figures from attention lane 3"):
        _plan([_attn("attn0", 0, "gpu0", 100 * M, 10 * M)], lane=3)


def test_probe_peaks() -> None:
    # Prefill steps 5, 9, 7; decodes of 1 and 8 rows twice: the second pair prices a row, (33 - 2) // 7.
    peaks = ProbePeaks.of([5, 9, 7, 1, 40, 2, 33], rows=8)
    assert (peaks.prefill, peaks.decode, peaks.row_bytes) == (9, 40, 4)


def test_probe_steps(tiny_checkpoints) -> None:
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", max_running_requests=8,
                                   context_length=256, chunked_prefill_size=16))
    afd = AfdArgs(num_mb=2)
    steps = probe_steps(plan, afd, 16384)
    tokens = [sum(mb.num_tokens for mb in s.micro_batches) for s in steps]
    assert [s.phase for s in steps[-4:]] == ["decode"] * 4 and tokens[-4:] == [1, 8, 1, 8]
    # A lane's step holds at most 8 slots x a chunk of 16 prompt tokens.
    assert max(tokens[:-4]) == 128 and all(s.phase == "prefill" for s in steps[:-4])
    assert not any(s.use_graph or s.last for s in steps)
    assert all(len(s.micro_batches) == 2 and s.bucket <= largest_bucket(plan, 16384) for s in steps)
