"""The lock-step warm-up: before the coordinator reports ready, every worker runs the same warm-up
steps in the same order (each step's bucket and use_graph alike on every rank), covering every
shape class a step can take, on scratch state only, so the pools are exactly empty afterwards;
a worker that fails a warm-up step fails the start with its reason, and nothing hangs."""
from __future__ import annotations

import functools
import math
import pickle
import time

import pytest

from minisgl.afd import launch
from minisgl.afd.args import AfdArgs
from minisgl.afd.attention_worker import AttentionWorker
from minisgl.afd.buckets import decode_graph_buckets
from minisgl.afd.coordinator import Coordinator
from minisgl.afd.expert_worker import ExpertWorker
from minisgl.afd.protocol import ATTN, AgPlan, EgPlan, WarmupStep, WorkerSpec
from minisgl.afd.warmup import wanted, warmup_steps
from minisgl.afd.worker import worker_main
from minisgl.afd.worker_group import WorkerFailure, WorkerGroup
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import resolve_plan
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler.messages import GenerateRequest

ENGINE = dict(device="cpu", dtype="float32", page_size=16, context_length=256, chunked_prefill_size=16,
              max_running_requests=4)
PREFILL_BUDGET = 16384  # the scheduler's default --max-prefill-tokens, above what a lane can take


def _plan(path: str, **kwargs):
    return resolve_plan(EngineArgs(model_path=path, **{**ENGINE, **kwargs}))


def _tokens(mbs) -> list[int]:
    return [n for mb in mbs for n in mb.extend]


def test_warmup_is_on_where_kernels_compile_unless_asked() -> None:
    assert wanted("auto", ["cuda:0", "cuda:1"]) and not wanted("auto", ["cpu", "cpu"])
    assert wanted("on", ["cpu"]) and not wanted("off", ["cuda:0"])


@pytest.mark.parametrize("graphs,num_mb,how,max_bs", [(False, 1, "count", None), (False, 2, "context", None),
                                                      (True, 1, "count", None), (True, 2, "count", 1)])
def test_warmup_steps_cover_every_step_kind(tiny_checkpoints, graphs, num_mb, how, max_bs) -> None:
    plan = _plan(tiny_checkpoints["bf16"], cuda_graph_max_bs=max_bs)
    afd = AfdArgs(attn_workers=2, expert_workers=2, num_mb=num_mb, mb_split=how, graph_buckets=graphs)
    buckets = decode_graph_buckets(plan, afd)
    assert bool(buckets) == graphs
    steps = warmup_steps(plan, afd, buckets, PREFILL_BUDGET)
    assert [s.step for s in steps] == list(range(len(steps)))
    assert [s.last for s in steps] == [False] * (len(steps) - 1) + [True]
    rows, chunk = ENGINE["max_running_requests"], ENGINE["chunked_prefill_size"]
    graph_buckets, lane_decodes, lane_prefill, mixed, largest_mixed = set(), set(), set(), 0, 0
    for s in steps:
        assert s.num_mb == num_mb, s
        assert all(p + e <= ENGINE["context_length"] for mb in s.micro_batches for p, e in zip(mb.prefix, mb.extend))
        largest = max(mb.num_tokens for mb in s.micro_batches)
        if s.use_graph:  # a decode step that fits the graphs takes the smallest bucket that holds it
            assert s.phase == "decode" and set(_tokens(s.micro_batches)) == {1}, s
            assert s.bucket == min(b for b in buckets if b >= largest), s
            graph_buckets.add(s.bucket)
        else:
            assert s.bucket == 1 << (largest - 1).bit_length(), s
            assert not (s.phase == "decode" and buckets and largest <= buckets[-1]), s
        reqs = [(e, p) for mb in s.micro_batches for e, p in zip(mb.extend, mb.prefix)]
        if s.phase == "decode":
            lane_decodes.add(len(reqs))
        elif any(e == 1 and p > 0 for e, p in reqs) and any(e > 1 for e, _ in reqs):  # decodes beside a chunk
            mixed += 1
            largest_mixed = max(largest_mixed, sum(e for e, _ in reqs))
        else:
            lane_prefill.add(sum(e for e, _ in reqs))
    # Prefill up to the most a lane's step can hold (a chunk per slot), never beyond.
    assert max(lane_prefill) == rows * chunk and {2, chunk, chunk + 1} <= lane_prefill
    assert graph_buckets == set(buckets)
    if graphs:  # decode steps beyond the largest graph run eagerly; no step mixes decodes and chunks
        top = buckets[-1]
        assert {n for n in range(1, rows + 1) if math.ceil(n / num_mb) > top} <= lane_decodes
        assert mixed == 0
    else:
        assert set(range(1, rows + 1)) <= lane_decodes and mixed >= 2
        # every slot decoding beside the lane's whole prefill budget (a chunk per slot)
        assert largest_mixed == rows + rows * chunk
    if num_mb == 2:  # a one-request step leaves a micro-batch idle; its exchange still runs
        assert any(not mb.extend for s in steps for mb in s.micro_batches)


@pytest.mark.parametrize("m,n,num_mb,graphs", [(1, 1, 1, False), (2, 2, 2, True)])
def test_warmup_runs_in_lock_step_and_leaves_the_pools_empty(tiny_checkpoints, monkeypatch, m, n, num_mb,
                                                             graphs) -> None:
    sent: dict[str, list] = {}
    send = WorkerGroup.send

    def record(self, name: str, data: bytes) -> None:
        sent.setdefault(name, []).append(pickle.loads(data))
        send(self, name, data)

    monkeypatch.setattr(WorkerGroup, "send", record)
    plan = _plan(tiny_checkpoints["bf16"])
    afd = AfdArgs(attn_workers=m, expert_workers=n, num_mb=num_mb, graph_buckets=graphs, warmup="on")
    coord = Coordinator(plan, afd)
    try:
        report = coord.warmup
        want = warmup_steps(plan, afd, coord.graph_buckets, coord.prefill_budget)
        assert len(sent) == m + n
        for name, msgs in sent.items():  # every worker, the same steps in the same order, before any plan
            assert msgs == want, name
        assert report.steps == len(want) and len(report.replies) == len(want)
        for step, replies in zip(want, report.replies):
            assert set(replies) == set(sent) and {r.step for r in replies.values()} == {step.step}
            assert all(r.peak_bytes is None and r.compiles == 0 for r in replies.values())  # CPU: nothing to measure
        assert coord.info.warmup_seconds == report.seconds > 0
        coord.check_integrity()
        stats = coord.stats()
        assert (stats.used_pages, stats.used_slots, stats.num_running) == (0, 0, 0)
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        for i in range(3):
            coord.add_request(GenerateRequest(f"r{i}", tuple(range(1, 20 + 7 * i)), params))
        produced: dict[str, int] = {}
        while coord.has_work:
            for o in coord.step():
                produced[o.rid] = produced.get(o.rid, 0) + len(o.new_token_ids)
        assert produced == {"r0": 6, "r1": 6, "r2": 6}
        kinds = {type(p) for msgs in sent.values() for p in msgs[len(want):]}
        assert kinds == {AgPlan, EgPlan}
        coord.check_integrity()
        assert coord.stats().used_pages == 0 and coord.stats().used_slots == 0
    finally:
        coord.close()


def _fail_at_warmup_step(spec: WorkerSpec, victim: str, at_step: int) -> None:
    """worker_main, with `victim`'s warm-up failing at step `at_step` (in the worker process)."""
    if spec.name == victim:
        role = AttentionWorker if spec.role == ATTN else ExpertWorker
        run = role.warm_up

        def warm_up(self, step: WarmupStep) -> None:
            if step.step == at_step:
                raise RuntimeError(f"injected fault in warm-up step {at_step}")
            run(self, step)

        role.warm_up = warm_up
    worker_main(spec)


@pytest.mark.parametrize("victim", ["expert1", "attn0"])
def test_worker_failing_warmup_fails_the_start_with_its_reason(tiny_checkpoints, monkeypatch, victim) -> None:
    monkeypatch.setattr(launch, "worker_main", functools.partial(_fail_at_warmup_step, victim=victim, at_step=3))
    launcher = launch.LocalLauncher()
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as failure:
        Coordinator(_plan(tiny_checkpoints["bf16"]), AfdArgs(attn_workers=1, expert_workers=2, num_mb=2, warmup="on"),
                    launcher=launcher)
    took = time.monotonic() - start
    message = str(failure.value)
    assert f"AFD worker {victim} failed in the warm-up: RuntimeError: injected fault in warm-up step 3" == message
    assert took < 30, took  # the peers blocked in the step's exchange are stopped, not waited for
    assert all(p.exitcode is not None for p in launcher.procs.values()), "every worker is stopped"


@pytest.mark.parametrize("how", ["count", "context"])
def test_a_lane_step_pairs_lone_prompts_in_each_micro_batch(tmp_path, how) -> None:
    """Chunks of 8,192 tokens and lanes of 16,384: the lane's largest step is two chunks, one a
    micro-batch, and pairs nothing; a lane step of four 4,096-token prompts splits into two pairs
    of lone prompts, which run as halves (prefill_groups.prefill_calls) through the conv's row-map
    variant. A warm-up step must pair in every micro-batch, so that variant compiles before ready."""
    from minisgl.models.tiny.make import make_tiny_model
    from minisgl.prefill_groups import prefill_calls

    path = make_tiny_model(str(tmp_path), seed=1, overrides={"max_position_embeddings": 32768})
    plan = _plan(path, context_length=32768, chunked_prefill_size=8192, max_running_requests=8)
    steps = warmup_steps(plan, AfdArgs(attn_workers=2, expert_workers=2, num_mb=2, mb_split=how), (), PREFILL_BUDGET)

    def pairs(extend) -> bool:
        return any(p.offset for call in prefill_calls(extend) for p in call)

    prefill = [[mb.extend for mb in s.micro_batches] for s in steps if s.phase == "prefill"]
    assert [(8192,), (8192,)] in prefill  # the largest step pairs nothing
    assert any(all(pairs(mb) for mb in mbs) for mbs in prefill), prefill
