"""The host time AFD workers spend launching decode steps, from their replies: every worker of a
run reports one time per decode step (prefill steps are not counted), and the mean over a window
comes from two totals."""
from __future__ import annotations

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.launch_times import LaunchTimes, mean_ms_between


def test_mean_over_a_window_of_totals() -> None:
    times = LaunchTimes()
    times.add("attn0", 0.010)
    before = times.totals()
    times.add("attn0", 0.002)
    times.add("attn0", 0.004)
    times.add("expert0", 0.001)
    assert mean_ms_between(before, times.totals()) == {"attn0": 3.0, "expert0": 1.0}
    assert mean_ms_between(times.totals(), times.totals()) == {}


def test_every_worker_reports_each_decode_step(tiny_checkpoints) -> None:
    afd = AfdArgs(attn_workers=1, expert_workers=2)
    with LLM(tiny_checkpoints["bf16"], afd=afd, device="cpu", dtype="float32", page_size=16, context_length=64,
             max_running_requests=2) as llm:
        llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        totals = llm.scheduler.decode_launch.totals()
    assert set(totals) == {"attn0", "expert0", "expert1"}
    for seconds, steps in totals.values():
        assert steps == 5 and seconds > 0  # the first token of each comes from the prefill step
