"""--load-format dummy under AFD: the attention workers (no routed experts) and the expert workers
(a slice of the experts each) hold exactly the colocated engine's seeded values, so AFD on a
config-only model directory gives the colocated engine's greedy tokens (what the 122B check on the
GPU, benchmarks/afd_agreement.py, relies on)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.afd.args import AfdArgs
from minisgl.afd.expert_stage import ExpertShard
from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.models.dummy_weights import init_dummy_weights
from minisgl.models.tiny.configs import qwen35_moe_config
from minisgl.moe.torch_experts import TorchExperts

ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=128, chunked_prefill_size=16,
              max_running_requests=4, load_format="dummy")


@pytest.fixture(scope="module")
def config_only(tmp_path_factory, tiny_checkpoints) -> str:
    """config.json and a tokenizer, no weights."""
    path = tmp_path_factory.mktemp("dummy_cfg")
    (path / "config.json").write_text(json.dumps(qwen35_moe_config(4)))
    shutil.copy(os.path.join(tiny_checkpoints["bf16"], "tokenizer.json"), path)
    return str(path)


def test_expert_slices_hold_the_colocated_experts(config_only) -> None:
    engine = Engine(resolve_plan(EngineArgs(config_only, **ENGINE)))
    config = engine.config
    full = dict(engine.model.named_parameters())
    start, count = config.num_experts // 2, config.num_experts // 4
    shard = ExpertShard(config, start, count, TorchExperts())
    init_dummy_weights(shard, seed=0)
    for name, p in shard.named_parameters():
        assert torch.equal(p, full[name][start : start + count]), name
    other = ExpertShard(config, start, count, TorchExperts())
    init_dummy_weights(other, seed=1)
    assert not torch.equal(other.layers[0].mlp.experts.down_proj, shard.layers[0].mlp.experts.down_proj)


@pytest.mark.parametrize("m,n,mb", [(1, 2, 1), (2, 1, 2)])
def test_afd_on_dummy_weights_gives_the_colocated_tokens(config_only, m, n, mb) -> None:
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (k,), generator=g).tolist() for k in (3, 19, 40)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(config_only, **ENGINE) as llm:
        want = [r.token_ids for r in llm.generate(prompts, params)]
    afd = AfdArgs(attn_workers=m, expert_workers=n, num_mb=mb, warmup="on")
    with LLM(config_only, afd=afd, **ENGINE) as llm:
        got = [r.token_ids for r in llm.generate(prompts, params)]
    assert got == want
