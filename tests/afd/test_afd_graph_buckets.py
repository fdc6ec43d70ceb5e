"""Decode graph buckets in AFD: which buckets a worker prepares, which bucket a step takes, and the
plans and workers refusing a graph step they could not replay. (Greedy identity with graph-bucket
planning, and the plans of real steps, are in test_afd_identity.py.)"""
from __future__ import annotations

from dataclasses import replace

import pytest

from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import check_graph_bucket, decode_graph_buckets, step_bucket
from minisgl.afd.protocol import AgPlan, EgPlan, ReqStep
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan


@pytest.fixture(scope="module")
def cpu_plan(tiny_checkpoints):
    return resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", max_running_requests=20))


def test_buckets_follow_the_workers_device(cpu_plan) -> None:
    assert decode_graph_buckets(cpu_plan, AfdArgs()) == ()  # the CPU captures nothing
    gpu = cpu_plan.on_device("cuda:0")
    assert decode_graph_buckets(gpu, AfdArgs()) == (1, 2, 4, 8, 16, 20)
    assert decode_graph_buckets(gpu, AfdArgs(num_mb=2)) == (1, 2, 4, 8, 10)  # per micro-batch
    assert decode_graph_buckets(gpu, AfdArgs(num_mb=3)) == (1, 2, 4, 7)  # the largest of 7, 7, 6
    disabled = replace(cpu_plan.args, disable_cuda_graph=True)
    assert decode_graph_buckets(resolve_plan(disabled).on_device("cuda:0"), AfdArgs()) == ()


def test_forced_buckets_and_the_graph_cap(cpu_plan) -> None:
    assert decode_graph_buckets(cpu_plan, AfdArgs(force_graph_buckets=True)) == (1, 2, 4, 8, 16, 20)
    capped = resolve_plan(replace(cpu_plan.args, cuda_graph_max_bs=6))
    assert decode_graph_buckets(capped, AfdArgs(force_graph_buckets=True)) == (1, 2, 4, 6)
    assert decode_graph_buckets(capped, AfdArgs(force_graph_buckets=True, num_mb=4)) == (1, 2, 4, 5)


@pytest.mark.parametrize(
    "tokens,decode,want",
    [(1, True, (1, True)), (3, True, (4, True)), (5, True, (6, True)), (6, True, (6, True)),
     (7, True, (8, False)), (3, False, (4, False)), (6, False, (8, False)), (17, False, (32, False))],
)
def test_step_bucket(tokens: int, decode: bool, want: tuple[int, bool]) -> None:
    assert step_bucket((1, 2, 4, 6), tokens, decode) == want


def test_without_graph_buckets_every_step_is_eager() -> None:
    assert step_bucket((), 3, True) == (4, False)


def test_a_graph_step_of_an_unprepared_bucket_is_refused() -> None:
    check_graph_bucket(5, 4, True, (1, 2, 4))
    check_graph_bucket(5, 8, False, (1, 2, 4))  # an eager step may take any bucket
    with pytest.raises(ValueError, match=r"step 5: graph bucket 8 is not one this worker prepared \[1, 2, 4\]"):
        check_graph_bucket(5, 8, True, (1, 2, 4))
    with pytest.raises(ValueError, match="graph bucket 1 is not one"):
        check_graph_bucket(0, 1, True, ())


def test_graph_plans_hold_decodes_only() -> None:
    decode, chunk = ReqStep("a", 1, 5, 1, None, True), ReqStep("b", 2, 0, 3, (1, 2, 3), True)
    assert AgPlan(0, 2, ((decode,), ()), use_graph=True).use_graph
    with pytest.raises(ValueError, match="decodes only, not prefill chunks"):
        AgPlan(0, 4, ((decode,), (chunk,)), use_graph=True)
    assert EgPlan(0, 2, 2, "decode", use_graph=True).use_graph
    with pytest.raises(ValueError, match="decodes only, not a prefill phase"):
        EgPlan(0, 2, 4, "prefill", use_graph=True)
