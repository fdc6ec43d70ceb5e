"""Decode graph buckets in AFD: which buckets a worker prepares, which bucket a step takes, the
plans and workers refusing a graph step they could not replay, and the start-up handshake (every
worker reports the buckets it prepared; a mismatch or a failed preparation fails the start). (Greedy identity with graph-bucket
planning, and the plans of real steps, are in test_afd_identity.py.)"""
from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import pytest

from minisgl.afd import attention_worker, expert_worker, launch
from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import check_graph_bucket, decode_graph_buckets, step_bucket
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.protocol import AgPlan, EgPlan, ReqStep, WorkerSpec
from minisgl.afd.worker import worker_main
from minisgl.afd.worker_group import WorkerFailure
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan


@pytest.fixture(scope="module")
def cpu_plan(tiny_checkpoints):
    return resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", max_running_requests=20))


def test_buckets_are_opt_in_on_every_device(cpu_plan) -> None:
    gpu = cpu_plan.on_device("cuda:0")
    assert decode_graph_buckets(cpu_plan, AfdArgs()) == () == decode_graph_buckets(gpu, AfdArgs())
    assert decode_graph_buckets(gpu, AfdArgs(graph_buckets=True)) == (1, 2, 4, 8, 16, 20)
    assert decode_graph_buckets(gpu, AfdArgs(graph_buckets=True, num_mb=2)) == (1, 2, 4, 8, 10)  # per micro-batch
    assert decode_graph_buckets(gpu, AfdArgs(graph_buckets=True, num_mb=3)) == (1, 2, 4, 7)  # the largest of 7, 7, 6


def test_buckets_and_the_graph_cap(cpu_plan) -> None:
    assert decode_graph_buckets(cpu_plan, AfdArgs(graph_buckets=True)) == (1, 2, 4, 8, 16, 20)
    capped = resolve_plan(replace(cpu_plan.args, cuda_graph_max_bs=6))
    assert decode_graph_buckets(capped, AfdArgs(graph_buckets=True)) == (1, 2, 4, 6)
    assert decode_graph_buckets(capped, AfdArgs(graph_buckets=True, num_mb=4)) == (1, 2, 4, 5)


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


def _with_buckets_off(victim: str, spec: WorkerSpec) -> None:
    """A worker entry point that prepares no graph buckets on `victim`, whatever the others do."""
    if spec.name == victim:
        spec = replace(spec, afd_args=replace(spec.afd_args, graph_buckets=False))
    worker_main(spec)


def _failing_to_prepare(victim: str, spec: WorkerSpec) -> None:
    """A worker entry point whose graph preparation fails on `victim`."""
    if spec.name == victim:
        def fail(plan, afd):
            raise RuntimeError("injected: decode graph capture failed")

        expert_worker.decode_graph_buckets = fail
        attention_worker.decode_graph_buckets = fail
    worker_main(spec)


def _start(path: str) -> Coordinator:
    args = EngineArgs(model_path=path, device="cpu", dtype="float32", context_length=256, max_running_requests=4)
    return Coordinator(resolve_plan(args), AfdArgs(graph_buckets=True, step_timeout_s=30))


@pytest.mark.parametrize("entry,match", [
    (_with_buckets_off, r"AFD workers prepared different decode graph buckets: attn0 \[1, 2, 4\]; expert0 \[\]"),
    (_failing_to_prepare, "AFD worker expert0 failed at start-up: RuntimeError: injected: decode graph capture failed"),
])
def test_start_fails_unless_every_worker_prepared_the_same_buckets(tiny_checkpoints, monkeypatch, entry, match) -> None:
    monkeypatch.setattr(launch, "worker_main", partial(entry, "expert0"))  # what LocalLauncher starts
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match=match):
        _start(tiny_checkpoints["bf16"])
    assert time.monotonic() - start < 15  # every worker stopped too: close() waits for none

