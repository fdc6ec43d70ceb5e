"""State slots the prefix cache keeps beside the running requests': how the planner and the flags
split the slots, and what the pool allocates for them."""
from __future__ import annotations

import argparse

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.kvcache.planner import MAX_AUTO_RUNNING, PoolCosts, plan_pool, slot_split
from minisgl.server.cli_args import add_engine_args, engine_args_from

MIB = 1 << 20
# A slot costs 100 MiB of state + 10 MiB of decode activations; a page of 64 tokens 1 MiB.
COSTS = PoolCosts(slot_bytes=100 * MIB, row_bytes=10 * MIB, page_bytes=MIB, page_size=64)


@pytest.mark.parametrize("total, split", [(66, (63, 3)), (33, (31, 2)), (18, (17, 1)), (17, (16, 1)), (2, (1, 1)),
                                          (1, (1, 0))])
def test_the_running_requests_leave_the_cache_a_sixteenth(total: int, split: tuple[int, int]) -> None:
    assert slot_split(total, None, prefix_cache=True) == split
    assert slot_split(total, None, prefix_cache=False) == (total, 0)


def test_given_running_requests_leave_the_rest_to_the_cache() -> None:
    assert slot_split(66, 60, prefix_cache=True) == (60, 6)
    assert slot_split(60, 60, prefix_cache=False) == (60, 0)
    with pytest.raises(ValueError, match="max_mamba_cache_size 50 must be at least max_running_requests 60"):
        slot_split(50, 60, prefix_cache=True)
    with pytest.raises(ValueError, match="only more with the prefix cache"):
        slot_split(66, 60, prefix_cache=False)


def test_given_running_requests_get_cache_slots_on_top() -> None:
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, 8, prefix_cache=True)
    assert (plan.max_running_requests, plan.cache_slots, plan.num_pages) == (8, 1, 8 * 128)
    assert plan.state_bytes == 9 * 100 * MIB and plan.row_reserve_bytes == 8 * 10 * MIB  # cache slots decode nothing
    assert any("1 more slots for the prefix cache (--max-mamba-cache-size 9)" in n for n in plan.notes)
    assert plan.config(PoolConfig(1, 8192, 64, prefix_cache=True)).num_slots == 9


def test_auto_slots_are_split_out_of_the_state_share() -> None:
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 32768, None, prefix_cache=True)
    plain = plan_pool(COSTS, 4000 * MIB, 262144, 32768, None)
    assert (plain.max_running_requests, plain.cache_slots) == (18, 0)
    assert (plan.max_running_requests, plan.cache_slots) == (17, 1)  # the same 18 slots of state
    assert plan.state_bytes == plain.state_bytes and plan.num_pages == 4000 - 17 * 110 - 100
    capped = plan_pool(PoolCosts(slot_bytes=MIB, row_bytes=0, page_bytes=1024, page_size=16), 100_000 * MIB, 4096,
                       4096, None, prefix_cache=True)
    assert (capped.max_running_requests, capped.cache_slots) == (MAX_AUTO_RUNNING, MAX_AUTO_RUNNING // 16)


def test_max_mamba_cache_size_sets_every_slot() -> None:
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, None, prefix_cache=True, max_slots=10)
    assert (plan.max_running_requests, plan.cache_slots) == (9, 1)
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, 4, prefix_cache=True, max_slots=10)
    assert (plan.max_running_requests, plan.cache_slots, plan.state_bytes) == (4, 6, 1000 * MIB)


def test_slots_lowered_keep_the_cache_its_share() -> None:
    # 40 running + 2 cache slots (4600 MiB) leave no room for one request's 128 pages: the most that
    # do are 33 + 2 (3830 MiB of the 3872).
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, 40, prefix_cache=True)
    assert (plan.max_running_requests, plan.cache_slots) == (33, 2)
    assert plan.num_pages == 4000 - 33 * 110 - 200 >= 128
    assert any("lowered from 40 to 33" in n for n in plan.notes)


def test_the_flags_on_the_cpu() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args_from(parser.parse_args(["--device", "cpu", "--max-running-requests", "4",
                                               "--max-mamba-cache-size", "6"]))
    assert (args.max_running_requests, args.max_mamba_cache_size) == (4, 6)
    pool = resolve_plan(args).pool
    assert (pool.max_running_requests, pool.cache_slots, pool.num_slots) == (4, 2, 6)
    default = resolve_plan(EngineArgs(device="cpu")).pool
    assert (default.max_running_requests, default.cache_slots) == (16, 1)
    assert resolve_plan(EngineArgs(device="cpu", enable_prefix_caching=False)).pool.cache_slots == 0
    with pytest.raises(ValueError, match="only more with the prefix cache"):
        resolve_plan(EngineArgs(device="cpu", enable_prefix_caching=False, max_running_requests=4,
                                max_mamba_cache_size=6))
    with pytest.raises(ValueError, match="max_mamba_cache_size must be >= 1"):
        EngineArgs(max_mamba_cache_size=0)
    with pytest.raises(ValueError, match="cache_slots must be >= 0, and 0 without the prefix cache"):
        PoolConfig(4, 64, cache_slots=1)


def test_the_pool_holds_state_and_table_rows_for_every_slot() -> None:
    layout = PoolLayout(full_layers=(1,), num_kv_heads=1, head_dim=2, linear_layers=(0,), conv_dim=3, conv_kernel=4,
                        num_value_heads=1, key_head_dim=2, value_head_dim=2)
    pool = HybridPool(layout, PoolConfig(2, 64, 16, prefix_cache=True, cache_slots=3), torch.float32, "cpu")
    assert pool.state.ssm.shape[1] == pool.page_table.shape[0] == 6  # 5 slots and the dummy
    assert pool.dummy_row == 5 and pool.max_running == 2
    slots = {pool.allocate(16), pool.allocate(16)}
    assert not pool.can_allocate(16)  # two run; the other three slots are the cache's
    pool.check_integrity()
    for s in slots:
        pool.free(s)
    assert pool.free_slots == 5
