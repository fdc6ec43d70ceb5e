"""Where the warm-up takes GDN groups of a whole step (engine/device_memory.py), each step size is a
new group size. fla's L2 norm specialised on it (a group's tokens x key heads, per 65536 rows: four
variants for 16 key heads over 16K-token steps), and the served 35B compiled them after ready; the
conv now normalises q and k and fla's norm never runs, so the warm-up runs no step per size band.
Steps of several requests the warm-up never ran must compile nothing; so must steps whose two lone prompts run as
halves (prefill_groups.prefill_calls) under groups of 4,096 tokens. (Its own module:
test_warm_start.py's engines hold the GPU's memory until that module ends.)"""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine import compile_watch, device_memory
from minisgl.models.tiny.make import make_tiny_model
from minisgl.prefill_budget import lone_prompt_tokens
from minisgl.prefill_groups import prefill_calls

pytestmark = pytest.mark.gpu


def test_whole_step_gdn_groups_warm_every_group_size(tmp_path) -> None:
    pytest.importorskip("fla")  # without it the GDN backend is ours, which does not specialise on group sizes
    path = make_tiny_model(str(tmp_path), seed=7, overrides={"linear_num_key_heads": 16, "linear_num_value_heads": 16})
    llm = LLM(path, device="cuda", dtype="bfloat16")  # chunks of 1024, steps of up to 16384 tokens
    try:
        assert llm.engine.gdn_group_tokens == 16384, "the tiny model's groups cost ~nothing: the warm-up takes them"
        before = compile_watch.compile_count()
        greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        g = torch.Generator().manual_seed(4)
        # With nothing decoding a step takes the whole budget: one step, one group, of 10,000 tokens
        # (3 of the L2 norm's row blocks), then of 6,001 (2).
        for lengths in ([1000] * 10, [1000] * 6 + [1]):
            llm.generate([torch.randint(0, 500, (n,), generator=g).tolist() for n in lengths], greedy)
        assert compile_watch.compile_count() == before, compile_watch.summary()
    finally:
        llm.close()


# (--chunked-prefill-size, prompt lengths sent together): chunks of the whole budget, where two long
# prompts' chunks pair as they are; and the default chunk of 1,024, where two 1K chunks share a group
# but budget nobody else can take grows both prompts to 4,096 tokens (prefill_budget.lone_prompt_tokens),
# which pair: the served 122B compiled the conv's row-map variant after ready at such a step.
HALVES_STEPS = {"chunks of the budget": (16384, ([8192, 8192], [5000, 7000])),
                "grown chunks": (None, ([8192, 8192],))}


@pytest.mark.parametrize("case", sorted(HALVES_STEPS))
def test_lone_prompts_as_halves_compile_nothing_after_warm_up(tmp_path, monkeypatch, case: str) -> None:
    """Groups of 4,096 tokens, as the 122B keeps (here by refusing whole-step groups): no warm-up step
    of chunks pairs lone prompts, yet a step of two long prompts runs as halves, through the conv's
    row-map variant (ours, with or without fla). The warm-up's own step of halves (engine/warmup.py,
    halves_shape) must have compiled it."""
    chunk, steps = HALVES_STEPS[case]
    monkeypatch.setattr(device_memory, "wide_groups_pay", lambda growth, room: False)
    path = make_tiny_model(str(tmp_path), seed=7, overrides={"linear_num_key_heads": 16, "linear_num_value_heads": 16,
                                                               "max_position_embeddings": 32768})
    llm = LLM(path, device="cuda", dtype="bfloat16", **({} if chunk is None else {"chunked_prefill_size": chunk}))
    try:
        assert llm.engine.gdn_group_tokens is None, "the engine must keep the default groups of 4,096 tokens"
        grown = lone_prompt_tokens(llm.scheduler.chunk_size, llm.scheduler.prefill_budget)
        before = compile_watch.compile_count()
        greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        g = torch.Generator().manual_seed(5)
        for lengths in steps:
            first = [min(n, grown) for n in lengths]  # the first step's chunks, both prompts alone in it
            assert any(p.offset for call in prefill_calls(first) for p in call), f"{first} must run as halves"
            llm.generate([torch.randint(0, 500, (n,), generator=g).tolist() for n in lengths], greedy)
        assert compile_watch.compile_count() == before, compile_watch.summary()
    finally:
        llm.close()
