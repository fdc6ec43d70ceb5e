"""Steps that a piecewise CUDA-graph runner replays, against the same steps run eagerly on a twin pool:
prefill of several prompts, a mixed step (decodes leading, a new prompt after them) smaller than the
step before it in the same bucket (so stale rows from that step sit in the padding), a decode-only
step, and a mixed step that reaches the top bucket. Shared by the CPU test (no capture) and the
GPU test (captured graphs)."""
from __future__ import annotations

import torch

from minisgl.engine.engine import Engine
from minisgl.engine.piecewise_graph import PiecewiseGraphRunner
from minisgl.engine.warmup import largest_prefill, shape_batch
from minisgl.forward_batch import ForwardBatch
from minisgl.kvcache.hybrid_pool import HybridPool

BUCKETS = [16, 48, 96]
# (new prompt lengths, whether every running request also decodes one token)
STEPS = [((5, 13, 22), False), ((17,), True), ((), True), ((59,), True)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def make_runner(engine: Engine, capture: bool) -> PiecewiseGraphRunner:
    cfg = engine.pool_cfg
    scratch = HybridPool.scratch(engine.layout, cfg.max_seq_len, cfg, engine.dtype, engine.device)

    def make(tokens: int) -> ForwardBatch:
        return shape_batch(largest_prefill(tokens, tokens, cfg.max_seq_len),
                           lambda t, p, s: ForwardBatch.build(t, p, s, scratch.page_table, cfg.page_size, engine.device),
                           engine.config.vocab_size)

    return PiecewiseGraphRunner(engine.model, scratch, make, BUCKETS, capture=capture)


def pool_state(pool: HybridPool, slots: list[int]) -> list[torch.Tensor]:
    """What the steps wrote: the requests' conv and SSM states and every KV page."""
    out = []
    if pool.state is not None:
        out += [pool.state.conv[:, slots].clone(), pool.state.ssm[:, slots].clone()]
    if pool.kv is not None:
        out += [pool.kv.k.clone(), pool.kv.v.clone()]
    return out


def run_both(engine: Engine, runner: PiecewiseGraphRunner,
             reference: PiecewiseGraphRunner | None = None) -> list[tuple[str, float]]:
    """(step, relative error of the runner's logits against the reference's: eager steps, or
    another runner's replays) for every step, then one entry per pool tensor the steps wrote."""
    pools = [HybridPool(engine.layout, engine.pool_cfg, engine.dtype, engine.device) for _ in range(2)]
    gen = torch.Generator().manual_seed(7)
    vocab = engine.config.vocab_size
    seqs: list[list[int]] = []  # tokens of each running request so far (both pools hold the same)
    slots: list[list[int]] = [[], []]
    errors = []
    with torch.inference_mode():
        for step, (prompts, decode) in enumerate(STEPS):
            rows = [[int(torch.randint(0, vocab, (1,), generator=gen))] for _ in seqs] if decode else []
            new = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in prompts]
            prefix = [len(s) for s in seqs] if decode else []
            logits = []
            for which, pool in enumerate(pools):
                for n in prompts:
                    slots[which].append(pool.allocate(256))
                running = slots[which][: len(seqs)] if decode else []
                for s, r, p in zip(running, rows, prefix):
                    pool.ensure_tokens(s, p + len(r))
                fresh = slots[which][len(seqs):]
                for s, t in zip(fresh, new):
                    pool.ensure_tokens(s, len(t))
                batch = ForwardBatch.build(rows + new, prefix + [0] * len(new), running + fresh, pool.page_table,
                                           pool.page_size, engine.device)
                assert batch.num_tokens <= runner.buckets[-1]
                if which == 1:
                    logits.append(runner.replay(batch, pool))
                else:
                    logits.append(engine.model(batch, pool) if reference is None else reference.replay(batch, pool))
            errors.append((f"step {step} ({batch.num_tokens} tokens, bucket {runner.bucket(batch.num_tokens)})",
                           rel_err(logits[1], logits[0])))
            seqs = [s + r for s, r in zip(seqs, rows)] if decode else seqs
            seqs += new
    for i, (a, b) in enumerate(zip(*(pool_state(p, s) for p, s in zip(pools, slots)))):
        errors.append((f"pool tensor {i}", rel_err(b, a)))
    return errors
