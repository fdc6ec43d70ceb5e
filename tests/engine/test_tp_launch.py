"""`--tp-size 2` through the real launch path: this process is rank 0 and schedules, a follower
process runs rank 1 from step messages (pool table changes, the batch's shape) and gets the input
ids by broadcast. Same tokens and logits as one rank, with chunked prefill, mixed steps and
prompt logprobs (the logit rows travel by broadcast too); a follower that fails to load, or dies,
is an error that names it, not a hang."""
from __future__ import annotations

import glob
import multiprocessing as mp
import os
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisgl import LLM, SamplingParams
from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from tp_harness import generate, rel_err

ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=128, chunked_prefill_size=16,
              max_running_requests=4)
PROMPT_LENS = (5, 40, 1, 23, 12)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in PROMPT_LENS]


def test_tp2_rank0_scheduler_matches_single_rank(tiny_checkpoints) -> None:
    path = tiny_checkpoints["bf16"]
    want = generate(Engine(resolve_plan(EngineArgs(path, **ENGINE))), _prompts(), 32)
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    want_lp = LLM(path, **ENGINE).generate(_prompts()[1], scored)[0]
    with LLM(path, tp_size=2, **ENGINE) as llm:
        assert llm.engine.followers is not None and len(llm.engine.followers.procs) == 1
        got = generate(llm.engine, _prompts(), 32)
        got_lp = llm.generate(_prompts()[1], scored)[0]
        llm.scheduler.check_integrity()
    assert got.tokens == want.tokens and got.extend_lens == want.extend_lens
    assert any(1 in s and max(s) > 1 for s in got.extend_lens)  # decodes beside a prefill chunk
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        for row in range(b.shape[0]):
            assert rel_err(a[row], b[row]) < 1e-5, f"step {step}, row {row}"
    assert got_lp.token_ids == want_lp.token_ids
    for g, w in zip(got_lp.prompt_logprobs[1:], want_lp.prompt_logprobs[1:]):
        assert g.token_id == w.token_id and abs(g.logprob - w.logprob) < 1e-4
        assert [t for t, _ in g.top] == [t for t, _ in w.top]


@pytest.mark.parametrize("chunk", [16, 64], ids=["step-ends-there", "snapshot"])
def test_tp2_followers_copy_the_cached_states(tiny_checkpoints, chunk: int) -> None:
    """Prompts that reuse a cached prefix, and one that takes over what a finished request fed,
    under TP: the follower copies its share of the state and sets its page table from the step
    messages, so the tokens and logprobs are one rank's without the cache. The prefix is cached
    where a prefill step ends (chunks of 16), or from inside one (a snapshot the step message names)."""
    path = tiny_checkpoints["bf16"]
    engine = {**ENGINE, "chunked_prefill_size": chunk}
    g = torch.Generator().manual_seed(12)
    first = torch.randint(0, 512, (70,), generator=g).tolist()
    second = first[:60] + torch.randint(0, 512, (30,), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3)
    plain = LLM(path, enable_prefix_caching=False, **engine)
    want = plain.generate([second], params)[0]
    third = second + list(want.token_ids[:3]) + [7, 8]  # continues what `second` fed: takes its slot over
    want_third = plain.generate([third], params)[0]
    with LLM(path, tp_size=2, **engine) as llm:
        llm.generate([first[:-1] + [(first[-1] + 1) % 512]], params)  # all but the last token as `first`
        llm.generate([first], params)
        got = llm.generate([second], params)[0]
        got_third = llm.generate([third], params)[0]
    assert got.num_cached_tokens == 48 and want.num_cached_tokens == 0
    assert got_third.num_cached_tokens == len(second) + 3
    # Two ranks sum their shares in another order than one: fp32 noise, measured as the other checks of
    # this file measure it (the difference's norm over the reference's; per element, a logprob near
    # -1.3 missed 1e-5 by 9% on a CPU with AMX and AVX-512).
    for have, expect in ((got, want), (got_third, want_third)):
        assert have.token_ids == expect.token_ids
        for a, b in zip(have.logprobs, expect.logprobs):
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert rel_err(torch.tensor([v for _, v in a.top]), torch.tensor([v for _, v in b.top])) < 1e-5


@pytest.mark.load
def test_dead_follower_is_an_error(tiny_checkpoints) -> None:
    llm = LLM(tiny_checkpoints["bf16"], tp_size=2, **ENGINE)
    try:
        follower = llm.engine.followers.procs[0]
        os.kill(follower.pid, signal.SIGKILL)
        follower.join(10)
        with pytest.raises(RuntimeError, match=f"TP rank 1 \\(pid {follower.pid}\\) exited"):
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
    finally:
        llm.close()


def test_follower_load_failure_fails_the_start(tiny_checkpoints, tmp_path) -> None:
    """Only EP rank 1 reads expert 5: a checkpoint without it fails rank 1 alone, and rank 0's
    start reports rank 1's own error."""
    src, dst = tiny_checkpoints["qwen3_moe"], tmp_path / "m"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = {}
    for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        tensors.update(load_file(f))
    missing = "model.layers.1.mlp.experts.5.down_proj.weight"
    del tensors[missing]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(RuntimeError, match=f"TP rank 1 .*missing tensor '{missing}'"):
        LLM(str(dst), tp_size=2, ep_size=2, **ENGINE)
    assert not mp.active_children()
