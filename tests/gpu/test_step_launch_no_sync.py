"""The overlap loop only overlaps if launching a step never waits for the device: the scheduler
enqueues step k+1 while step k runs and waits on step k's tokens afterwards. A blocking copy or a
read of a device value anywhere in the launch (a Python list used as a CUDA index is one) makes the
host wait for step k, so the host's planning of every step adds to the step time.

CUDA's sync debug mode raises on such a wait; here it is on around every launch of a greedy run
with decode steps (graph replays), chunked-prefill steps mixed with decodes, eager decodes
beyond the largest graph bucket, and steps that take prefix-cache snapshots."""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.models.tiny.make import make_tiny_model
from minisgl.scheduler.messages import GenerateRequest

pytestmark = pytest.mark.gpu

# What a server on CUDA runs (auto): the prefill path is the one a user's prompts take.
KERNELS = dict(attention_backend="triton", gdn_backend="fla", moe_backend="triton")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    path = make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=5)
    return LLM(path, device="cuda", dtype="float32", page_size=16, context_length=512, max_running_requests=12,
               cuda_graph_max_bs=8, **KERNELS)


def _launches_without_sync(llm: LLM, prompts: list[list[int]], params: SamplingParams,
                           chat_turn: bool = False) -> tuple[int, dict]:
    """Run the prompts to the end with every launch under the sync debug mode; the number of
    launches and the scheduler's outputs by request."""
    sched = llm.scheduler
    launch = sched._launch
    launches = [0]

    def checked():  # noqa: ANN202
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            launches[0] += 1

    sched._launch = checked
    outputs: dict[str, list[int]] = {}
    try:
        for i, p in enumerate(prompts):
            sched.add_request(GenerateRequest(f"r{i}", tuple(p), params, chat_turn))
        while sched.has_work:
            for out in sched.step():
                outputs.setdefault(out.rid, []).extend(out.new_token_ids)
    finally:
        del sched._launch
    sched.check_integrity()
    return launches[0], outputs


def test_launches_never_wait_for_the_device(llm: LLM) -> None:
    g = torch.Generator().manual_seed(9)
    lengths = (3, 17, 40, 90, 130, 5, 64, 200, 11, 33, 7, 150)  # 12 requests: beyond the graphs' 8
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]
    llm.scheduler.prefill_budget = 48  # long prompts run in chunks beside decoding requests
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    launches, outputs = _launches_without_sync(llm, prompts, params)
    assert launches > 24 and sorted(outputs) == sorted(f"r{i}" for i in range(len(prompts)))
    assert all(len(t) == 24 for t in outputs.values())
    # The same tokens as generate(), which runs the same loop without the debug mode.
    want = [r.token_ids for r in llm.generate(prompts, params, use_tqdm=False)]
    assert [tuple(outputs[f"r{i}"]) for i in range(len(prompts))] == want


def test_snapshot_steps_never_wait_for_the_device(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat turns are cached shortly before their end: with 48-token chunks, the chunk of a long
    prompt that passes that point takes a snapshot, whose state writes must not wait either."""
    g = torch.Generator().manual_seed(10)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (200, 130, 90, 150)]
    llm.scheduler.prefill_budget = 48
    taken = []
    snapshot_prefix = llm.engine.pool.snapshot_prefix

    def spy(slot, tokens):  # noqa: ANN001, ANN202
        kept = snapshot_prefix(slot, tokens)
        taken.append(kept)
        return kept

    monkeypatch.setattr(llm.engine.pool, "snapshot_prefix", spy)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    _, outputs = _launches_without_sync(llm, prompts, params, chat_turn=True)
    assert any(kept is not None for kept in taken), "no step took a snapshot"
    want = [r.token_ids for r in llm.generate(prompts, params, use_tqdm=False)]
    assert [tuple(outputs[f"r{i}"]) for i in range(len(prompts))] == want
