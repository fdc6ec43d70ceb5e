"""What of the AFD decode graphs the CPU can check (the captures and replays themselves run in
tests/gpu/test_afd_graphs.py):

- every rank decides alike whether it captures, from the shared flags only, and says why not;
- the lock-step warm-up holds one graph step per bucket, where every rank captures it;
- a worker's loop launches step k + K before the host waits for step k (--afd-async-pending-steps),
  and never waits for a plan it has not been sent;
- an expert worker's step at a bucket's static shape: rows padded with expert id -1 (an eager
  step's padding) compute nothing, and padding rows routed like real ones (a graph step's dummy
  decodes) leave the real rows' partial sums as they are.
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest
import torch

from minisgl.afd import worker
from minisgl.afd.args import AfdArgs
from minisgl.afd.buckets import decode_graph_buckets
from minisgl.afd.expert_stage import ExpertStage
from minisgl.afd.protocol import ATTN, EXPERT, Reply, Shutdown, WorkerSpec
from minisgl.afd.step_graphs import capture_blocker
from minisgl.afd.warmup import warmup_steps
from minisgl.engine.args import EngineArgs
from minisgl.engine.plan import BackendNames, resolve_plan
from minisgl.models.context import Backends
from minisgl.moe.registry import MOE_BACKENDS


@pytest.fixture(scope="module")
def gpu_plan(tiny_checkpoints):
    """A plan resolved for a GPU (nothing runs on it), with the torch backends (importable here)."""
    args = EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", attention_backend="torch",
                      gdn_backend="torch", moe_backend="torch")
    return resolve_plan(args).on_device("cuda:0")


def _spec(plan, role: str = ATTN, **afd) -> WorkerSpec:
    args = dict(graph_buckets=True, gpus=1, transport="ipc") | afd
    return WorkerSpec(role, 0, 0 if role == ATTN else 1, ("127.0.0.1", 0), "ipc://plans", "ipc://replies", plan,
                      AfdArgs(**args), str(plan.device))


class _GraphSafe:
    cuda_graph_safe = True


def test_every_rank_captures_only_where_the_shared_flags_allow(gpu_plan, tiny_checkpoints, monkeypatch) -> None:
    # The torch references walk requests on the host: neither role captures, and both say why.
    blocker = capture_blocker(_spec(gpu_plan, EXPERT), gpu_plan)
    assert blocker == "TorchAttentionBackend, TorchExperts synchronise with the host in decode", blocker
    assert capture_blocker(_spec(gpu_plan, ATTN), gpu_plan) == blocker, "both roles must decide alike"
    # With backends that replay from graphs (the Triton ones, which need triton to import).
    monkeypatch.setattr(BackendNames, "build", lambda self: Backends(_GraphSafe(), _GraphSafe(), _GraphSafe()))
    for role in (ATTN, EXPERT):
        assert capture_blocker(_spec(gpu_plan, role), gpu_plan) is None
    assert "--afd-graph-buckets" in capture_blocker(_spec(gpu_plan, graph_buckets=False), gpu_plan)
    cpu = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu"))
    assert capture_blocker(_spec(cpu, transport="p2p", gpus=None), cpu) == "the workers run on the CPU"
    off = resolve_plan(replace(gpu_plan.args, disable_cuda_graph=True)).on_device("cuda:0")
    assert capture_blocker(_spec(off), off) == "--disable-cuda-graph"
    assert "p2p transport" in capture_blocker(_spec(gpu_plan, transport="p2p", gpus=None), gpu_plan)
    assert "--afd-attn-tp-size" in capture_blocker(_spec(gpu_plan, attn_tp_size=2, gpus=None), gpu_plan)
    assert "per-layer timing" in capture_blocker(_spec(gpu_plan, layer_timing_dir="/tmp/t"), gpu_plan)
    assert "--afd-warmup off" in capture_blocker(_spec(gpu_plan, warmup="off"), gpu_plan)


@pytest.mark.parametrize("max_running", [4, 20, 64])
@pytest.mark.parametrize("num_mb", [1, 2, 3])
@pytest.mark.parametrize("how", ["count", "context"])
def test_the_warmup_holds_one_graph_step_per_bucket(tiny_checkpoints, max_running, num_mb, how) -> None:
    """Every rank captures each bucket at the warm-up's step of it: every bucket needs exactly one
    (a real graph step of a bucket without a graph is refused)."""
    plan = resolve_plan(EngineArgs(model_path=tiny_checkpoints["bf16"], device="cpu", context_length=256,
                                   max_running_requests=max_running))
    afd = AfdArgs(graph_buckets=True, num_mb=num_mb, mb_split=how)
    buckets = decode_graph_buckets(plan, afd)
    steps = warmup_steps(plan, afd, buckets, 16384)
    assert sorted(s.bucket for s in steps if s.use_graph) == list(buckets)


class _Runner:
    """A StepRunner that records when each step is launched and retired."""

    name, device, graph_buckets, captured_graphs = "attn0", torch.device("cpu"), (), 0

    def __init__(self, events: list) -> None:
        self.events = events

    def launch(self, plan: int) -> int:
        self.events.append(("launch", plan))
        return plan

    def retire(self, launched: int) -> Reply:
        self.events.append(("retire", launched))
        return Reply(launched, self.name)

    def warm_up(self, step) -> None:
        raise AssertionError("no warm-up here")


class _Plan(int):
    @property
    def step(self) -> int:
        return int(self)


class _Channel:
    """Plans queued as the coordinator sends them; an empty queue reads as no message yet."""

    def __init__(self, plans: list) -> None:
        self.plans: deque = deque(plans)
        self.sent: list = []

    def recv(self, timeout_ms: int):
        return self.plans.popleft() if self.plans else Shutdown()

    def send(self, msg) -> None:
        self.sent.append(msg)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_step_k_plus_depth_is_launched_before_step_k_is_waited_for(depth: int) -> None:
    events: list = []
    chan = _Channel([_Plan(i) for i in range(8)])
    worker.serve(_Runner(events), chan, depth, parent_pid=None)
    for k in range(8 - depth):
        assert events.index(("launch", k + depth)) < events.index(("retire", k)), events
    assert [m.step for m in chan.sent] == list(range(8)), "every step retired once, in order"
    in_flight = 0
    for kind, _ in events:
        in_flight += 1 if kind == "launch" else -1
        assert in_flight <= depth + 1, f"more than depth + 1 launched: {events}"


def test_a_worker_with_no_plan_waiting_retires_instead_of_waiting() -> None:
    """The coordinator leads by depth + 1, but when it has nothing to send the worker must not wait
    for a plan: it retires what it holds (a plan not there yet reads as no message)."""
    events: list = []

    class Sparse(_Channel):
        def recv(self, timeout_ms: int):
            if timeout_ms == 0:  # nothing queued right now, with steps in flight
                return None
            return super().recv(timeout_ms)

    chan = Sparse([_Plan(0), _Plan(1)])
    worker.serve(_Runner(events), chan, 3, parent_pid=None)
    assert events == [("launch", 0), ("retire", 0), ("launch", 1), ("retire", 1)]


def test_padding_rows_leave_the_real_rows_partial_sums_alone(gpu_plan) -> None:
    config = gpu_plan.config
    e, h = config.num_experts, config.hidden_size
    stage = ExpertStage(config, e // 2, e - e // 2, MOE_BACKENDS.get("torch")())  # the upper half of the experts
    g = torch.Generator().manual_seed(0)
    for p in stage.parameters():
        p.data = torch.randn(p.shape, generator=g) * 0.1
    real, pad, k = 5, 11, config.top_k
    x = torch.randn(real, h, generator=g)
    ids = torch.randint(0, e, (real, k), generator=g)
    w = torch.rand(real, k, generator=g)
    want = stage(x, ids, w)
    assert want.abs().sum() > 0, "the real rows reach this worker's experts"
    # An eager step's padding: zeros routed to expert -1.
    eager = stage(torch.cat([x, torch.zeros(pad, h)]), torch.cat([ids, torch.full((pad, k), -1)]),
                  torch.cat([w, torch.zeros(pad, k)]))
    torch.testing.assert_close(eager[:real], want, rtol=1e-6, atol=1e-6)
    assert eager[real:].abs().sum() == 0, "a row routed nowhere computes nothing"
    # A graph step's padding: the dummy decodes' rows, routed like real ones.
    graph = stage(torch.cat([x, torch.randn(pad, h, generator=g)]),
                  torch.cat([ids, torch.randint(0, e, (pad, k), generator=g)]),
                  torch.cat([w, torch.rand(pad, k, generator=g)]))
    torch.testing.assert_close(graph[:real], want, rtol=1e-6, atol=1e-6)
