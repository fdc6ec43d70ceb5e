"""A prefill step of several request groups, whose GDN chunked rule runs a group at a time
(prefill_groups.py), against the same step with its requests in one call, on twin pools. Shared by
the CPU test (torch backend) and the GPU test (fla)."""
from __future__ import annotations

import pytest
import torch

from minisgl import forward_batch
from minisgl.engine.engine import Engine
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool

LENGTHS = (1500, 700, 2100, 300, 1200, 900)  # 6,700 tokens: groups of 2, 3 and 1 requests


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def grouped_against_whole(engine: Engine) -> list[tuple[str, float]]:
    """(what, relative error of the grouped run against the whole one): the logits, then the
    requests' SSM and conv states."""
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, engine.config.vocab_size, (n,), generator=gen).tolist() for n in LENGTHS]
    outs = []
    for grouped in (True, False):
        pool = HybridPool(engine.layout, engine.pool_cfg, engine.dtype, engine.device)
        slots = [pool.allocate(n + 1) for n in LENGTHS]
        for s, n in zip(slots, LENGTHS):
            pool.ensure_tokens(s, n)
        batch = ForwardBatch.build(prompts, [0] * len(prompts), slots, pool.page_table, pool.page_size, engine.device)
        with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
            if not grouped:  # the same step with its requests in one group
                mp.setattr(forward_batch, "prefill_groups", lambda lens, *bounds: [(0, len(lens))])
            logits = engine.model(batch, pool)
        spans = [len(g.extend_lens) for g in batch.groups]
        assert spans == ([2, 3, 1] if grouped else []), "the step must split for the test to mean anything"
        outs.append([logits, pool.state.ssm[:, slots].clone(), pool.state.conv[:, slots].clone()])
    return [(what, rel_err(a, b)) for what, a, b in zip(("logits", "ssm state", "conv state"), *outs)]
