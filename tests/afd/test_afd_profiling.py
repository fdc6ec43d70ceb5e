"""The presets' profiling window reaches the AFD workers: MINISGL_PROFILE=torch writes one Chrome
trace per worker covering the requested steps."""
from __future__ import annotations

import json
import os

import pytest

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.step_profiler import StepProfiler


def test_torch_profile_window_writes_a_trace_per_worker(tiny_checkpoints, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MINISGL_PROFILE", "torch")
    monkeypatch.setenv("MINISGL_PROFILE_STEPS", "2:5")
    monkeypatch.setenv("MINISGL_PROFILE_DIR", str(tmp_path))
    with LLM(tiny_checkpoints["bf16"], afd=AfdArgs(attn_workers=1, expert_workers=1), device="cpu",
             context_length=128) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for worker in ("attn0", "expert0"):
        with open(os.path.join(tmp_path, f"{worker}.json")) as f:
            assert json.load(f)["traceEvents"], worker


def test_bad_profile_settings(monkeypatch) -> None:
    monkeypatch.setenv("MINISGL_PROFILE", "perf")
    monkeypatch.setenv("MINISGL_PROFILE_STEPS", "1:2")
    with pytest.raises(ValueError, match="MINISGL_PROFILE must be one of"):
        StepProfiler.from_env("attn0")
    monkeypatch.setenv("MINISGL_PROFILE", "torch")
    monkeypatch.setenv("MINISGL_PROFILE_STEPS", "5:5")
    with pytest.raises(ValueError, match="START < STOP"):
        StepProfiler.from_env("attn0")
    monkeypatch.delenv("MINISGL_PROFILE")
    assert StepProfiler.from_env("attn0") is None
