"""Expert plans, step plans, and start-up errors for bad AFD topologies (raised before any worker starts)."""
from __future__ import annotations

import pickle

import pytest

from minisgl import LLM
from minisgl.afd.args import AfdArgs
from minisgl.afd.expert_plan import ExpertPlan
from minisgl.afd.protocol import AgPlan, EgPlan, NewRequest, PageAssignment, ReqStep
from minisgl.sampling_params import SamplingParams


@pytest.mark.parametrize("experts,workers", [(256, 4), (256, 8), (512, 8), (512, 4), (8, 2), (6, 3), (10, 5)])
def test_expert_plan_partitions_every_expert_once(experts: int, workers: int) -> None:
    plan = ExpertPlan(experts, workers)
    owned = [e for r in range(workers) for e in range(*plan.owned(r))]
    assert owned == list(range(experts))
    assert all(plan.owner(e) == r for r in range(workers) for e in range(*plan.owned(r)))


def test_expert_plan_rejects_uneven_split() -> None:
    with pytest.raises(ValueError, match="E % N"):
        ExpertPlan(8, 3)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_mb": 0}, "--afd-num-mb"),
        ({"async_pending_steps": 0}, "--afd-async-pending-steps"),
        ({"attn_workers": 0}, "--afd-attn-workers"),
        ({"expert_workers": 0}, "--afd-expert-workers"),
        ({"dispatch_dtype": "int4"}, "--afd-dispatch-dtype"),
        ({"attn_tp_size": 0}, "--afd-attn-tp-size"),
        ({"warmup": "maybe"}, "--afd-warmup"),
    ],
)
def test_bad_afd_args(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        AfdArgs(**kwargs)


def test_lead_exceeds_depth() -> None:
    for k in (1, 2, 3):
        assert AfdArgs(async_pending_steps=k).coordinator_lead == k + 1


def test_uneven_expert_split_fails_at_startup(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="8 experts cannot be split evenly over 3"):
        LLM(tiny_checkpoints["bf16"], afd=AfdArgs(expert_workers=3), device="cpu")


def test_more_micro_batches_than_requests_fails_at_startup(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="--afd-num-mb 4 exceeds --max-running-requests 2"):
        LLM(tiny_checkpoints["bf16"], afd=AfdArgs(num_mb=4), device="cpu", max_running_requests=2)


def _req(slot: int, n: int = 1, tokens: tuple[int, ...] | None = None) -> ReqStep:
    return ReqStep(f"r{slot}", slot, 5, n, tokens, True)


def test_step_plans_validate() -> None:
    with pytest.raises(ValueError, match="dummy slot"):
        _req(0)
    with pytest.raises(ValueError, match="exactly one token"):
        _req(1, n=2)
    with pytest.raises(ValueError, match="3 tokens for an extend of 2"):
        _req(1, n=2, tokens=(1, 2, 3))
    with pytest.raises(ValueError, match="exceeds the bucket"):
        AgPlan(0, 1, ((_req(1), _req(2)),))
    with pytest.raises(ValueError, match="appears twice"):
        AgPlan(0, 4, ((_req(1),), (_req(1),)))
    with pytest.raises(ValueError, match="phase"):
        EgPlan(0, 1, 1, "warmup")


def test_decode_plan_size_is_small() -> None:
    """A 64-request decode step for one lane pickles to a few KB: plans go once per step, never per layer."""
    mbs = tuple(tuple(_req(s) for s in range(1 + 32 * i, 33 + 32 * i)) for i in range(2))
    plan = AgPlan(7, 32, mbs, free_slots=(3,), new_requests=(NewRequest("x", 9, SamplingParams()),),
                  pages=(PageAssignment(9, 0, (1, 2)),))
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert len(pickle.dumps(plan)) < 8192
