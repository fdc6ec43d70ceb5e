"""End to end on the GPU: CUDA-graph decode replays eager decode token for token, the Triton
backends give the torch backends' greedy tokens, and an unaligned max_seq_len (4041 at page 64,
64 table columns) captures and replays a sequence that needs its last page."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.graph import check_table_width
from minisgl.models.tiny.make import make_tiny_model

pytestmark = pytest.mark.gpu

KERNELS = dict(attention_backend="triton", gdn_backend="triton", moe_backend="triton")
STEPS = 64
# Eight slots hold the six prompts: without it the planner gives the tiny model hundreds of slots,
# and every engine here would capture and warm up decode graphs for all of them.
SLOTS = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=11)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in (1, 9, 33, 70, 130, 257)]


def _greedy(max_tokens: int = STEPS) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_graph_replay_matches_eager(tiny: str) -> None:
    # fp32: a padded bucket may pick another split-KV count than the eager batch, which reorders
    # sums; in bf16 that rounding alone could flip a near-tie, in fp32 it cannot.
    common = dict(device="cuda", dtype="float32", page_size=16, context_length=1024, max_running_requests=SLOTS,
                  **KERNELS)
    graphed = LLM(tiny, cuda_graph_max_bs=8, **common)
    assert graphed.engine.graph_runner is not None
    eager = LLM(tiny, disable_cuda_graph=True, **common)
    assert eager.engine.graph_runner is None
    want = [r.token_ids for r in eager.generate(_prompts(), _greedy())]
    got = [r.token_ids for r in graphed.generate(_prompts(), _greedy())]
    assert got == want


def test_triton_backends_match_torch(tiny: str) -> None:
    common = dict(device="cuda", dtype="float32", page_size=16, context_length=1024, max_running_requests=SLOTS)
    ref = LLM(tiny, attention_backend="torch", gdn_backend="torch", moe_backend="torch", **common)
    ours = LLM(tiny, **KERNELS, **common)
    want = [r.token_ids for r in ref.generate(_prompts(), _greedy())]
    got = [r.token_ids for r in ours.generate(_prompts(), _greedy())]
    agree = sum(a == b for w, g in zip(want, got) for a, b in zip(w, g)) / sum(len(w) for w in want)
    assert got == want, f"token agreement {agree:.4f}"


def test_mixed_steps_match_torch(tiny: str) -> None:
    """A small prefill budget splits the prompts into chunks that run beside decoding requests:
    mixed steps, whose leading decode rows take the decode kernels (Triton: the GDN decode and the
    split-KV attention; the chunk the varlen kernels), must give the torch backends' tokens."""
    common = dict(device="cuda", dtype="float32", page_size=16, context_length=1024, max_running_requests=SLOTS)
    llms = [LLM(tiny, attention_backend="torch", gdn_backend="torch", moe_backend="torch", **common),
            LLM(tiny, **KERNELS, **common)]
    tokens = []
    for llm in llms:
        llm.scheduler.prefill_budget = 24
        tokens.append([r.token_ids for r in llm.generate(_prompts(), _greedy(32))])
    assert tokens[1] == tokens[0]


def test_unaligned_max_seq_len_reaches_the_last_page(tiny: str) -> None:
    llm = LLM(tiny, device="cuda", dtype="bfloat16", page_size=64, context_length=4041, max_running_requests=2,
              cuda_graph_max_bs=2, **KERNELS)
    runner = llm.engine.graph_runner
    assert runner is not None and runner.table_width == 64 and llm.engine.pool.page_table.shape[1] == 64
    prompt = torch.randint(0, 512, (3976,), generator=torch.Generator().manual_seed(4)).tolist()
    # 3976 prompt tokens + 65 generated = 4041 (the tiny model reaches 4096): the last decodes write
    # into page 64 (index 63), past 63 whole pages.
    out = llm.generate([prompt], _greedy(65))[0]
    assert len(out.token_ids) == 65 and out.finish_reason == "length"
    eager = LLM(tiny, device="cuda", dtype="bfloat16", page_size=64, context_length=4041, max_running_requests=2,
                disable_cuda_graph=True, **KERNELS)
    assert eager.generate([prompt], _greedy(65))[0].token_ids == out.token_ids
    with pytest.raises(ValueError, match="captured for 64"):
        check_table_width(torch.zeros(3, 65, dtype=torch.int32, device="cuda"), runner.table_width)
