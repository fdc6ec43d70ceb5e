"""A prefill step whose GDN chunked rule runs in several calls (prefill_groups.py) against the same
step with its requests in one call, on twin pools. Shared by the CPU test (torch backend) and the GPU
test (fla). Two steps: one of request groups, and one where two lone requests run as halves (their
q, k and v written by the conv in the calls' order, their outputs put back in the step's)."""
from __future__ import annotations

import pytest
import torch

from minisgl import forward_batch
from minisgl.engine.engine import Engine
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool
from minisgl.prefill_groups import Piece

# lengths -> the calls' pieces as (request, offset, length)
STEPS = {
    "groups": ((1500, 700, 2100, 300, 1200, 900),  # 6,700 tokens: groups of 2, 3 and 1 requests
               [[(0, 0, 1500), (1, 0, 700)], [(2, 0, 2100), (3, 0, 300), (4, 0, 1200)], [(5, 0, 900)]]),
    "halves": ((3000, 2600, 1500),  # two lone requests as halves cut at 64 tokens, then one alone
               [[(0, 0, 1472), (1, 0, 1280)], [(0, 1472, 1528), (1, 1280, 1320)], [(2, 0, 1500)]]),
}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def one_step(engine: Engine, step: str, decodes: int = 0, grouped: bool = True) -> list[torch.Tensor]:
    """[logits, the requests' SSM states, their conv states] after one of STEPS on a fresh pool, in
    its planned calls or (grouped=False) with its requests in one call. With `decodes`, the step is a
    mixed one: that many requests with 10 cached tokens decode a token each before the prompts
    (their outputs and the prompts' share one buffer)."""
    lengths, calls = STEPS[step]
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, engine.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    history = [torch.randint(0, engine.config.vocab_size, (11,), generator=gen).tolist() for _ in range(decodes)]
    pool = HybridPool(engine.layout, engine.pool_cfg, engine.dtype, engine.device)
    decoding = [pool.allocate(12) for _ in history]
    slots = [pool.allocate(n + 1) for n in lengths]
    for s, n in [*zip(decoding, [11] * decodes), *zip(slots, lengths)]:
        pool.ensure_tokens(s, n)
    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        if decodes:  # the decoding requests' first 10 tokens, cached
            engine.model(ForwardBatch.build([h[:10] for h in history], [0] * decodes, decoding, pool.page_table,
                                            pool.page_size, engine.device), pool)
        batch = ForwardBatch.build([h[10:] for h in history] + prompts, [10] * decodes + [0] * len(prompts),
                                   decoding + slots, pool.page_table, pool.page_size, engine.device)
        assert batch.leading_decodes == decodes
        if not grouped:  # the same step with its requests in one call
            mp.setattr(forward_batch, "prefill_calls",
                       lambda lens, *bounds: [tuple(Piece(i, 0, n) for i, n in enumerate(lens))])
        logits = engine.model(batch, pool)
    slots = decoding + slots
    made = [[(p.request, p.offset, p.length) for p in call] for call in batch.prefill_requests.gdn_calls]
    assert made == (calls if grouped else [[(i, 0, n) for i, n in enumerate(lengths)]]), \
        "the step must split as planned for the test to mean anything"
    assert (batch.prefill_requests.call_order is not None) == (grouped and step == "halves")
    return [logits, pool.state.ssm[:, slots].clone(), pool.state.conv[:, slots].clone()]


def grouped_against_whole(engine: Engine, step: str, decodes: int = 0) -> list[tuple[str, float]]:
    """(what, relative error of the run in calls against the whole one): the logits, then the
    requests' SSM and conv states (one_step)."""
    outs = [one_step(engine, step, decodes, grouped) for grouped in (True, False)]
    return [(what, rel_err(a, b)) for what, a, b in zip(("logits", "ssm state", "conv state"), *outs)]
