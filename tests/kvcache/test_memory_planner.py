"""The memory planner's arithmetic on made-up budgets, the pool costs it reads off the layout, and
the flag checks that run before any weight loads."""
from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.kvcache.hybrid_pool import HybridPool, PoolConfig, PoolLayout
from minisgl.kvcache.planner import MAX_AUTO_RUNNING, MemoryBudget, PoolCosts, PoolDoesNotFit, plan_pool
from minisgl.server.cli_args import add_engine_args, engine_args_from

MIB = 1 << 20
# A slot costs 100 MiB of state + 10 MiB of decode activations; a page of 64 tokens 1 MiB.
COSTS = PoolCosts(slot_bytes=100 * MIB, row_bytes=10 * MIB, page_bytes=MIB, page_size=64)


def test_budget_keeps_the_step_reserve_and_the_fraction() -> None:
    assert MemoryBudget(free=10_000, step_reserve=2_000, fraction=0.5).usable == 4_000
    assert MemoryBudget(free=1_000, step_reserve=2_000, fraction=0.9).usable == 0


def test_requested_slots_get_pages_for_the_whole_context_when_they_fit() -> None:
    # 8 requests of 8192 tokens: 8 * (110 + 128) MiB = 1904 MiB of the 4000 MiB.
    plan = plan_pool(COSTS, 4000 * MIB, model_max_len=262144, context_length=8192, max_running_requests=8)
    assert (plan.max_running_requests, plan.num_pages, plan.max_seq_len) == (8, 8 * 128, 8192)
    assert plan.state_bytes == 800 * MIB and plan.kv_bytes == 1024 * MIB and plan.row_reserve_bytes == 80 * MIB
    assert plan.notes == ()
    assert plan.max_concurrency(8192, 64) == 8


def test_pages_are_lowered_before_slots() -> None:
    # 30 slots take 3300 MiB; 700 pages are left where 30 * 128 = 3840 were wanted.
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, 30)
    assert plan.max_running_requests == 30 and plan.num_pages == 700
    assert any("KV pages lowered to 700" in n for n in plan.notes)
    assert plan.max_concurrency(8192, 64) == 700 // 128


def test_slots_are_lowered_only_when_one_full_request_would_not_fit() -> None:
    # 40 slots (4400 MiB) leave no room for one request's 128 pages: slots drop to (4000-128)//110 = 35.
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 8192, 40)
    assert plan.max_running_requests == 35 and plan.num_pages == 4000 - 35 * 110
    assert any("lowered from 40 to 35" in n for n in plan.notes)


def test_refuses_when_not_even_one_request_fits_and_says_what_would() -> None:
    with pytest.raises(PoolDoesNotFit, match=r"at most --context-length 1920\b"):
        # 140 MiB: a slot (110) and 30 pages of 64 tokens; one 8192-token request needs 238 MiB.
        plan_pool(COSTS, 140 * MIB, 262144, 8192, None)


def test_auto_slots_take_the_state_share_of_the_pool() -> None:
    plan = plan_pool(COSTS, 4000 * MIB, 262144, 32768, None)
    assert plan.max_running_requests == int(4000 * 0.9 / 1.9) // 100 == 18  # SGLang's ratio 0.9: 47% for state
    assert plan.num_pages == 4000 - 18 * 110  # the rest (less the slots' decode rows), below 18 * 512 pages
    assert plan.max_concurrency(8192, 64) == (4000 - 18 * 110) // 128 and plan.max_concurrency(32768, 64) == 3
    assert any("47% of the pool for state" in n for n in plan.notes)
    fewer = plan_pool(COSTS, 4000 * MIB, 262144, 32768, None, state_ratio=0.5)
    more = plan_pool(COSTS, 4000 * MIB, 262144, 32768, None, state_ratio=2.0)
    assert (fewer.max_running_requests, more.max_running_requests) == (4000 // 3 // 100, 4000 * 2 // 3 // 100)
    assert fewer.num_pages > plan.num_pages > more.num_pages


def test_auto_slots_without_state_fit_requests_of_the_sizing_length() -> None:
    no_state = PoolCosts(slot_bytes=0, row_bytes=10 * MIB, page_bytes=MIB, page_size=64)
    plan = plan_pool(no_state, 4000 * MIB, 262144, 32768, None)
    assert plan.max_running_requests == 4000 // 138  # 10 MiB of decode rows + 128 pages per 8192 tokens
    assert any("requests of 8192 tokens" in n for n in plan.notes)


def test_auto_slots_are_capped() -> None:
    tiny = PoolCosts(slot_bytes=MIB, row_bytes=0, page_bytes=1024, page_size=16)
    assert plan_pool(tiny, 100_000 * MIB, 4096, 4096, None).max_running_requests == MAX_AUTO_RUNNING


def test_without_a_context_the_model_limit_is_lowered_to_what_the_pages_hold() -> None:
    plan = plan_pool(COSTS, 4000 * MIB, 262144, None, None)
    assert plan.max_running_requests == 18
    assert plan.max_seq_len == plan.num_pages * 64 < 262144
    assert any("no --context-length" in n for n in plan.notes)
    roomy = plan_pool(COSTS, 10**6 * MIB, 4096, None, 4)
    assert roomy.max_seq_len == 4096


@pytest.mark.parametrize("ssm, kv", [("float32", None), ("bfloat16", None), ("float32", "float8_e4m3fn")])
def test_layout_costs_match_what_the_pool_allocates(ssm: str, kv: str | None) -> None:
    layout = PoolLayout(full_layers=(3, 7), num_kv_heads=2, head_dim=64, linear_layers=(0, 1, 2, 4, 5, 6),
                        conv_dim=384, conv_kernel=4, num_value_heads=4, key_head_dim=32, value_head_dim=32)
    flags = PoolConfig(5, 256, 16, num_pages=40, ssm_dtype=ssm, kv_dtype=kv)
    pool = HybridPool(layout, flags, torch.bfloat16, "cpu")
    costs = PoolCosts.of(layout, flags, torch.bfloat16, row_bytes=0)
    assert pool.state.nbytes == 6 * costs.slot_bytes  # 5 slots + the dummy
    assert pool.kv.nbytes == 41 * costs.page_bytes  # 40 pages + the dummy
    assert pool.kv.k.dtype == (torch.float8_e4m3fn if kv else torch.bfloat16)
    # by hand: K and V, 2 layers, 16 tokens, 2 heads of 64, in 1 byte (FP8) or 2
    assert costs.page_bytes == 2 * 2 * 16 * 2 * 64 * (1 if kv else 2)
    assert HybridPool.scratch(layout, 1024, flags, torch.bfloat16, "cpu").kv.k.dtype == pool.kv.k.dtype


def test_kv_cache_dtype_flag() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = engine_args_from(parser.parse_args(["--kv-cache-dtype", "fp8_e4m3"]))
    assert args.kv_cache_dtype == "fp8_e4m3"
    assert resolve_plan(replace(args, device="cpu")).pool.kv_dtype == "float8_e4m3fn"
    assert resolve_plan(EngineArgs(device="cpu")).pool.kv_dtype is None  # auto: the activations' dtype
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8_e4m3"):
        EngineArgs(kv_cache_dtype="fp8_e5m2")


def test_gpu_memory_utilization_is_an_alias() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_args_from(parser.parse_args(["--gpu-memory-utilization", "0.8"])).mem_fraction_static == 0.8
    assert engine_args_from(parser.parse_args(["--mem-fraction-static", "0.7"])).mem_fraction_static == 0.7


@pytest.mark.parametrize("ratio", [0.0, -1.0, float("nan"), float("inf")])
def test_state_ratio_must_be_positive(ratio: float) -> None:
    with pytest.raises(ValueError, match="mamba_full_memory_ratio must be > 0"):
        EngineArgs(mamba_full_memory_ratio=ratio)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01])
def test_fraction_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="mem_fraction_static must be in"):
        EngineArgs(mem_fraction_static=fraction)


def _config_only(tmp_path, tiny_checkpoints: dict[str, str]) -> str:
    """A tiny model's config.json with no weights: anything that got as far as loading would fail there."""
    with open(f"{tiny_checkpoints['bf16']}/config.json") as f:
        (tmp_path / "config.json").write_text(f.read())
    return str(tmp_path)


def test_context_beyond_the_model_fails_before_weights_load(tmp_path, tiny_checkpoints: dict[str, str]) -> None:
    path = _config_only(tmp_path, tiny_checkpoints)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        resolve_plan(EngineArgs(path, device="cpu", context_length=10**7))


def test_fraction_on_the_cpu_is_refused_before_weights_load(tmp_path, tiny_checkpoints: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="sizes the pool from GPU memory"):
        resolve_plan(EngineArgs(_config_only(tmp_path, tiny_checkpoints), device="cpu", mem_fraction_static=0.9))
