"""Where the warm-up takes GDN groups of a whole step (engine/device_memory.py), each step size is a
new group size, and fla specialises on it: its L2 norm on a group's tokens x key heads, per 65536
rows, gives four variants for 16 key heads over 16K-token steps. A step size the warm-up never ran
must still compile nothing. (Its own module: test_warm_start.py's engines hold the GPU's memory
until that module ends.)"""
from __future__ import annotations

import pytest
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine import compile_watch
from minisgl.models.tiny.make import make_tiny_model

pytestmark = pytest.mark.gpu


def test_whole_step_gdn_groups_warm_every_group_size(tmp_path) -> None:
    path = make_tiny_model(str(tmp_path), seed=7, overrides={
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "max_position_embeddings": 32768})
    llm = LLM(path, device="cuda", dtype="bfloat16", context_length=17000, chunked_prefill_size=16384,
              max_prefill_tokens=16384)
    try:
        assert llm.engine.gdn_group_tokens == 16384, "the tiny model's groups cost ~nothing: the warm-up takes them"
        before = compile_watch.compile_count()
        greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        g = torch.Generator().manual_seed(4)
        for n in (10000, 6001):  # one step each: groups of 3 and 2 row blocks of fla's L2 norm
            llm.generate([torch.randint(0, 500, (n,), generator=g).tolist()], greedy)
        assert compile_watch.compile_count() == before, compile_watch.summary()
    finally:
        llm.close()
