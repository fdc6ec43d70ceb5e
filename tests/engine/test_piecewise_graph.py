"""Piecewise CUDA graphs' data flow on the CPU (engine/piecewise_graph.py with capture=False): the
same static buffers, padding and core slicing as a graph replay, against eager steps, on the
hybrid Qwen3.5 model and on Qwen3-MoE. tests/gpu/test_piecewise_graph_capture.py replays
captured graphs."""
from __future__ import annotations

import pytest

from minisgl import LLM
from minisgl.engine.args import EngineArgs
from minisgl.engine.piecewise_graph import piecewise_buckets
from minisgl.engine.plan import resolve_plan
from piecewise_scenario import make_runner, run_both

REL_TOL = 1e-5


def test_buckets_cover_every_size_with_bounded_padding() -> None:
    buckets = piecewise_buckets(4096 + 512, 4096)
    assert buckets == sorted(set(buckets)) and buckets[0] == 16 and buckets[-1] == 4608
    assert {4160, 4224, 4352, 4608} <= set(buckets)  # a chunk and the decode rows beside it
    for small, big in zip(buckets, buckets[1:]):
        assert big <= max(2 * small, small * 1.25 + 64), (small, big)  # doubling only up to 256
    assert all(b % 64 == 0 for b in buckets if b > 256)
    assert piecewise_buckets(100, 4096) == [16, 32, 64, 100]
    with pytest.raises(ValueError, match="top bucket"):
        piecewise_buckets(0, 4096)


def test_flag_and_default() -> None:
    with pytest.raises(ValueError, match="piecewise_cuda_graph_max_tokens"):
        EngineArgs(piecewise_cuda_graph_max_tokens=-1)
    with pytest.raises(ValueError, match="needs CUDA graphs"):  # not ignored in silence
        EngineArgs(disable_cuda_graph=True, piecewise_cuda_graph_max_tokens=4096)
    EngineArgs(disable_cuda_graph=True, piecewise_cuda_graph_max_tokens=0)
    assert resolve_plan(EngineArgs(device="cpu")).piecewise_max_tokens == 0  # no graphs on the CPU


@pytest.mark.parametrize("ckpt", ["bf16", "qwen3_moe"])
def test_padded_replay_equals_eager(tiny_checkpoints, ckpt: str) -> None:
    llm = LLM(tiny_checkpoints[ckpt], dtype="float32", device="cpu", page_size=16, max_running_requests=8,
              context_length=256)
    errors = run_both(llm.engine, make_runner(llm.engine, capture=False))
    assert len(errors) > 4
    for what, err in errors:
        assert err < REL_TOL, f"{what}: relative error {err:.2e}"
