"""A prefill step whose GDN chunked rule runs in several calls (prefill_groups.py) against the same
step with its requests in one call, on twin pools. Shared by the CPU test (torch backend) and the GPU
test (fla). Two steps: one of request groups, and one where two lone requests run as halves (their
q, k and v written by the conv in the calls' order, their outputs put back in the step's). And a
step whose calls are cut where the prefix cache keeps states (snapshots) against a run that stops
at every cut (snapshots_against_stops)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from minisgl import forward_batch
from minisgl.engine.engine import Engine
from minisgl.forward_batch import ForwardBatch, Snapshot
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
                       lambda lens, *bounds, **cuts: [tuple(Piece(i, 0, n) for i, n in enumerate(lens))])
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


# A mixed step whose prompts leave snapshots (forward_batch.Snapshot): 2 decodes, then two lone
# prompts that run as halves (a cut in a's first half, one in b's second), one alone, and a group of
# a fresh prompt and a continued one (a prefix of 40 tokens). (request among the prompts, offset) of
# each snapshot. The halves are cut at multiples of fla's chunk (as pages of 64 tokens cut them), so
# that a run that stops there pairs its requests' rests at the same chunk boundaries; the group's
# prompts are cut anywhere too, closer to a prompt's start than the conv's window among them.
SNAPSHOT_LENGTHS = (3000, 2600, 1500, 150, 90)
SNAPSHOT_PREFIX = (0, 0, 0, 0, 40)
SNAPSHOT_CUTS = {
    "aligned": ((0, 1024), (1, 1984), (3, 64), (4, 64)),
    "anywhere": ((0, 1024), (1, 1984), (3, 2), (3, 100), (4, 1), (4, 64)),
}


def snapshots_against_stops(engine: Engine, cuts: str) -> list[tuple[str, float]]:
    """(what, relative error) of the step with SNAPSHOT_CUTS[cuts] against the same requests run in
    steps that stop at every cut (each request's pieces start where they do in the step, so every
    backend chunks them alike): the logits of the requests' last tokens, their SSM and conv states
    after it, and each snapshot's states against the stopped run's after the step that ends there."""
    points = SNAPSHOT_CUTS[cuts]
    gen = torch.Generator().manual_seed(12)
    vocab = engine.config.vocab_size
    prompts = [torch.randint(0, vocab, (p + n,), generator=gen).tolist()
               for p, n in zip(SNAPSHOT_PREFIX, SNAPSHOT_LENGTHS)]
    history = [torch.randint(0, vocab, (11,), generator=gen).tolist() for _ in range(2)]
    cfg = replace(engine.pool_cfg, max_running_requests=2 * (len(history) + len(prompts)) + len(points))
    pool = HybridPool(engine.layout, cfg, engine.dtype, engine.device)

    def run(seqs: list[list[int]], prefix: list[int], slots: list[int], snapshots=()) -> torch.Tensor:  # noqa: ANN001
        batch = ForwardBatch.build(seqs, prefix, slots, pool.page_table, pool.page_size, engine.device,
                                   snapshots=snapshots)
        return engine.model(batch, pool)

    def prepared(n: int) -> int:
        slot = pool.allocate(n + 1)
        pool.ensure_tokens(slot, n + 1)
        return slot

    twins = [[prepared(11) for _ in history] + [prepared(len(p)) for p in prompts] for _ in range(2)]
    kept = [prepared(1) for _ in points]
    # Each request's piece boundaries in its extend: 0, its cuts, its length (one piece for a decode).
    seqs = [h[10:] for h in history] + [p[SNAPSHOT_PREFIX[r]:] for r, p in enumerate(prompts)]
    prefix = [10] * len(history) + list(SNAPSHOT_PREFIX)
    bounds = [[0, *sorted(at for r, at in points if r + len(history) == i), len(seq)] for i, seq in enumerate(seqs)]
    stopped: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    last_logits: list[torch.Tensor | None] = [None] * len(seqs)
    with torch.inference_mode():
        # What the decodes and the continued prompt cached, on both twins.
        firsts = [(seq, s) for slots in twins for seq, s in zip([h[:10] for h in history], slots)]
        firsts += [(prompts[r][:n], slots[len(history) + r])
                   for slots in twins for r, n in enumerate(SNAPSHOT_PREFIX) if n]
        run([t for t, _ in firsts], [0] * len(firsts), [s for _, s in firsts])
        snaps = [Snapshot(len(history) + r, at, k) for (r, at), k in zip(points, kept)]
        step_logits = run(seqs, prefix, twins[0], snaps)
        # The run that stops at every cut: step j feeds each request's j-th piece.
        for j in range(max(len(b) - 1 for b in bounds)):
            live = [i for i, b in enumerate(bounds) if j + 1 < len(b)]
            logits = run([seqs[i][bounds[i][j] : bounds[i][j + 1]] for i in live],
                         [prefix[i] + bounds[i][j] for i in live], [twins[1][i] for i in live])
            for row, i in enumerate(live):
                last_logits[i] = logits[row]
                if j + 2 < len(bounds[i]):
                    stopped[(i, bounds[i][j + 1])] = (pool.state.ssm[:, twins[1][i]].clone(),
                                                      pool.state.conv[:, twins[1][i]].clone())
    state = pool.state
    errors = [("logits", rel_err(step_logits, torch.stack(last_logits))),
              ("ssm state", rel_err(state.ssm[:, twins[0]], state.ssm[:, twins[1]])),
              ("conv state", rel_err(state.conv[:, twins[0]], state.conv[:, twins[1]]))]
    for s in snaps:
        ssm, conv = stopped[(s.request, s.offset)]
        errors += [(f"snapshot {s.request}@{s.offset} ssm", rel_err(state.ssm[:, s.slot], ssm)),
                   (f"snapshot {s.request}@{s.offset} conv", rel_err(state.conv[:, s.slot], conv))]
    return errors
