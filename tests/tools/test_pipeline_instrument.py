"""AFD layer timing: off (the default) reads no clock and records no event; on, it marks every
(layer, micro-batch) of both workers, and a real AFD run's records feed the simulator."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.afd import layer_timing
from minisgl.afd.args import AfdArgs
from minisgl.afd.attention_worker import AttentionWorker
from minisgl.afd.expert_worker import ExpertWorker
from minisgl.afd.protocol import EgPlan
from minisgl.tools.pipeline.measured import summarize
from minisgl.tools.pipeline.sim import simulate

LAYERS, MBS = 3, 2


class _Mlp:
    def dispatch(self, y: torch.Tensor, mb: int) -> torch.Tensor:
        return 2 * y

    def combine(self, inflight: torch.Tensor) -> torch.Tensor:
        return inflight


class _Layer:
    mlp = _Mlp()

    def mixer_half(self, x: torch.Tensor, ctx: object) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x


class _Model:
    config = SimpleNamespace(hidden_size=4)
    layers = [_Layer() for _ in range(LAYERS)]

    def embed(self, batch: object, pool: object) -> tuple[torch.Tensor, object]:
        return torch.zeros(2, 4), None

    def logits(self, x: torch.Tensor, batch: object) -> torch.Tensor:
        return x


def _attention_worker(timer: layer_timing.LayerTimer | None) -> AttentionWorker:
    w = AttentionWorker.__new__(AttentionWorker)  # only what _forward reads
    w.model, w.timer, w.device = _Model(), timer, torch.device("cpu")
    w.engine = SimpleNamespace(dtype=torch.float32, pool=None)  # the worker's pool is its engine's
    w.last_token = torch.zeros(1)
    return w


class _Transport:
    def post_receive(self, mb: int, bucket: int) -> int:
        return mb

    def receive(self, pending: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.ones(2, 4), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1)

    def send_combine(self, mb: int, bucket: int, out: torch.Tensor) -> list:
        return []

    def check(self) -> None:  # the exchange's failures off the host: none here
        pass


def _expert_worker(timer: layer_timing.LayerTimer | None) -> ExpertWorker:
    w = ExpertWorker.__new__(ExpertWorker)  # only what launch reads
    w.name, w.num_layers, w.transport, w.device, w.timer = "expert0", LAYERS, _Transport(), torch.device("cpu"), timer
    w.shard = SimpleNamespace(stage=lambda layer: lambda x, ids, weights: x)
    w.graph_buckets = ()
    return w


def test_off_by_default_and_reads_no_clock(monkeypatch) -> None:
    assert AfdArgs().layer_timing_dir is None
    assert layer_timing.make_timer(None, "attn0", torch.device("cpu")) is None

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a clock was read or an event recorded with timing off")

    monkeypatch.setattr(layer_timing.time, "monotonic_ns", boom)
    monkeypatch.setattr(torch.cuda, "Event", boom)
    monkeypatch.setattr(layer_timing.StepMarks, "mark", boom)
    out = _attention_worker(None)._forward([object(), object()])
    assert len(out) == MBS and torch.equal(out[0], out[1])
    launched = _expert_worker(None).launch(EgPlan(step=0, num_mb=MBS, bucket=2, phase="decode"))
    assert launched.marks is None


def test_on_marks_every_layer_and_micro_batch(tmp_path) -> None:
    timer = layer_timing.LayerTimer(str(tmp_path), "attn0", torch.device("cpu"), {"role": "attn"})
    marks = timer.start(7)
    plain = _attention_worker(None)._forward([object(), object()])
    timed = _attention_worker(timer)._forward([object(), object()], marks)
    assert all(torch.equal(a, b) for a, b in zip(plain, timed))  # timing changes no result
    got = [(l, mb, name) for l, mb, name, _ in marks.resolved()]
    items = [(l, mb, n) for l in range(LAYERS) for mb in range(MBS) for n in ("combined", "dispatched")]
    last = [(LAYERS, mb, n) for mb in range(MBS) for n in ("combined", "logits")]
    assert got == [(-1, -1, "begin"), (-1, -1, "embedded"), *items, *last]
    us = [t for *_, t in marks.resolved()]
    assert us == sorted(us) and us[0] == 0

    eg = _expert_worker(layer_timing.LayerTimer(str(tmp_path), "expert0", torch.device("cpu"), {"role": "expert"}))
    launched = eg.launch(EgPlan(step=7, num_mb=MBS, bucket=2, phase="decode"))
    eg.retire(launched)
    names = [n for _, _, n, _ in launched.marks.resolved()]
    assert names == ["begin", *["received", "computed", "sent"] * (LAYERS * MBS), "end"]
    assert (tmp_path / "step000007-expert0.json").exists()


def test_afd_run_with_timing_and_context_split(tiny_checkpoints, tmp_path) -> None:
    """The context split gives the colocated engine's greedy tokens; the timing records of the run
    summarize into a spec whose predicted step is of the measured step's order."""
    path = tiny_checkpoints["bf16"]
    engine = dict(dtype="float32", device="cpu", page_size=16, context_length=128, max_running_requests=6)
    prompts = [[(7 * i + j) % 500 + 1 for j in range(n)] for i, n in enumerate([40, 3, 29, 11, 60, 17])]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in LLM(path, **engine).generate(prompts, params)]
    afd = AfdArgs(num_mb=2, async_pending_steps=2, mb_split="context", layer_timing_dir=str(tmp_path))
    with LLM(path, afd=afd, **engine) as llm:
        got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    m = summarize(str(tmp_path), skip=1)
    assert m.num_mb == 2 and m.steps >= 3 and len(m.spec.kinds) == 8
    sums = [sum(c) for c in m.contexts]
    assert max(sums) - min(sums) <= max(max(c) for c in m.contexts)  # balanced to within one request
    assert 0.3 < simulate(m.spec).step / m.step_us < 3.0


def test_bad_args_are_rejected() -> None:
    with pytest.raises(ValueError, match="mb-split"):
        AfdArgs(mb_split="tokens")
    with pytest.raises(ValueError, match="layer-timing-dir"):
        AfdArgs(layer_timing_dir=" ")
