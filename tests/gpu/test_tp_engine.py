"""Colocated TP on GPUs (needs 2): NCCL collectives, each rank's warm-up and memory plan in
lock-step (the ranks agree on one pool), and decode CUDA graphs that capture each rank's step
with its collectives (the input-id broadcast, the per-mixer and per-MoE all-reduces, the logits
all-gather) give the single-GPU engine's greedy tokens, with TP alone and with EP."""
from __future__ import annotations

import os

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.models.tiny.make import make_tiny_model

pytestmark = pytest.mark.gpu
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared hosts

KERNELS = dict(attention_backend="triton", gdn_backend="triton", moe_backend="triton")
COMMON = dict(device="cuda", dtype="float32", page_size=16, context_length=1024, max_running_requests=8,
              cuda_graph_max_bs=8, **KERNELS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices, found {torch.cuda.device_count()}")
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=12)


def _generate(path: str, **kwargs: object) -> tuple[list[tuple[int, ...]], LLM]:
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 9, 33, 70, 130)]
    llm = LLM(path, **COMMON, **kwargs)
    out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    return [r.token_ids for r in out], llm


@pytest.mark.parametrize("ep", [1, 2])
def test_tp2_graphs_match_one_gpu(tiny: str, ep: int) -> None:
    want, single = _generate(tiny)
    got, tp = _generate(tiny, tp_size=2, ep_size=ep)
    try:
        assert tp.engine.graph_runner is not None and tp.engine.preparation is not None
        layout = tp.engine.layout  # rank 0's share: 1 of 2 KV heads, 2 of 4 GDN value heads
        assert (layout.num_kv_heads, layout.num_value_heads) == (1, 2)
        assert got == want
    finally:
        tp.close()
