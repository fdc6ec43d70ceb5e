"""The prefix cache through the GPU's kernels: prompts that reuse a cached prefix (several users'
system prompt, a copy of its state) and one that takes a finished request over (its slot and pages,
its last page partly filled) run our Triton and fla kernels with CUDA graphs, and give the torch
reference's greedy tokens (CPU, fp32, no cache) wherever its top-1/top-2 gap exceeds the bf16
bound (tests/agreement.py), while the cache says it served them."""
from __future__ import annotations

import pytest

from agreement import GAP_BOUND, GREEDY_STEPS, greedy, greedy_check, heldout_prompts, reference
from minisgl import LLM
from minisgl.models.tiny.default import trained_model_path

pytestmark = pytest.mark.gpu

PAGE = 16
COMMON = dict(page_size=PAGE, context_length=512, max_running_requests=8)


def test_reused_prefixes_follow_the_reference() -> None:
    path = trained_model_path(fp8=False)
    held = heldout_prompts(path)
    system = held[-1][:70]  # 4 whole pages, 6 tokens into a fifth
    firsts = list(dict.fromkeys(held[-1][70:]))[:4]  # each user's question begins otherwise
    users = [system + [t] + held[4 + i] for i, t in enumerate(firsts)]
    cpu = LLM(path, device="cpu", dtype="float32", enable_prefix_caching=False, **COMMON)
    gpu = LLM(path, device="cuda", dtype="bfloat16", cuda_graph_max_bs=8, **COMMON)
    assert gpu.engine.graph_runner is not None and gpu.engine.pool.cfg.cache_slots >= 1
    got = [gpu.generate([u], greedy(GREEDY_STEPS), use_tqdm=False)[0] for u in users]  # one at a time
    # The first is like no other; the second parts from it after the system prompt's 4 whole pages
    # and caches them there; the others reuse them.
    assert [g.num_cached_tokens for g in got] == [0, 0, 4 * PAGE, 4 * PAGE]
    # The last user's next call: what it fed (its prompt and all but the last output token) and more.
    fed = users[3] + list(got[3].token_ids[:-1])
    more = fed + [got[3].token_ids[-1]] + held[2]
    again = gpu.generate([more], greedy(GREEDY_STEPS), use_tqdm=False)[0]
    assert again.num_cached_tokens in (len(fed), len(fed) + 1)  # + 1: the overlap loop fed the last token
    ref = reference(cpu, users + [more])
    check = greedy_check(ref, [list(g.token_ids) for g in got + [again]], GAP_BOUND["bfloat16"])
    print(f"greedy: {check.compared} steps compared, {check.parted} prompts parted at gaps <= the bound")
    assert not check.failures, check.failures
