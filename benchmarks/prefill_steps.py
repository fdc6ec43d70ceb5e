"""bench_prefill.py's engine steps at a known config's FP8 shapes (dummy weights; default
Qwen3.5-122B-A10B): whole prefill steps (optionally after a cached prefix, as later chunks of a long
prompt run) and mixed steps (a chunk beside decode rows), each from the piecewise CUDA graphs and eagerly,
with the host's share, against the FLOP roofline; decode steps from the same engine's graphs; and
where an eager step's host time goes (sync debug mode, cProfile)."""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import traceback
from dataclasses import dataclass
from typing import Sequence

import torch

from minisgl.engine.plan import resolve_plan
from minisgl.layers.fp8 import cdiv

MODEL = "Qwen3.5-122B-A10B"  # the default config


@dataclass(frozen=True)
class PrefillStep:
    """`requests` prompts of `tokens` new tokens each, after `prefix` tokens already in the pool."""

    requests: int
    tokens: int
    prefix: int = 0

    @classmethod
    def parse(cls, text: str) -> "PrefillStep":
        """'BxN' or 'BxN@P' (P cached tokens before the N new ones)."""
        shape, _, prefix = text.partition("@")
        b, n = (int(v) for v in shape.split("x"))
        return cls(b, n, int(prefix or 0))

    def __str__(self) -> str:
        return f"{self.requests} x {self.tokens}" + (f" after {self.prefix}" if self.prefix else "")


def attention_flops(heads: int, head_dim: int, tokens: int, prefix: int) -> int:
    """QK^T and PV of `tokens` new tokens after `prefix` cached ones, causal: token i (from 1) sees
    prefix + i keys, 2 FLOPs per multiply-add in each of the two products."""
    keys = tokens * prefix + tokens * (tokens + 1) // 2
    return 4 * heads * head_dim * keys


def model_flops(engine, lens: list[int], prefix: int = 0) -> float:  # noqa: ANN001
    """GEMM FLOPs of one prefill of requests of `lens` new tokens after `prefix` cached ones: every
    projection, router and shared expert per token, top-k routed experts per token, the lm_head per
    request, causal attention (token i of n attends to prefix + i keys)."""
    from minisgl.layers.fp8_linear import Fp8Linear
    from minisgl.layers.linear import Linear
    from minisgl.models.attention_mixer import Attention
    from minisgl.moe.local_moe import LocalMoE

    tokens = sum(lens)
    per_token = 0
    flops = 0.0
    for name, mod in engine.model.named_modules():
        if isinstance(mod, (Linear, Fp8Linear)):
            out_f, in_f = mod.weight.shape
            if name.endswith("lm_head"):
                flops += 2 * in_f * out_f * len(lens)
            else:
                per_token += 2 * in_f * out_f
        elif isinstance(mod, LocalMoE):
            _, two_i, hidden = mod.experts.gate_up_proj.shape
            per_token += mod.top_k * 2 * (two_i * hidden + hidden * two_i // 2)
        elif isinstance(mod, Attention):
            flops += sum(attention_flops(mod.num_heads, mod.head_dim, n, prefix) for n in lens)
    if engine.model.lm_head is None:  # tied embedding as the head
        flops += 2 * engine.config.hidden_size * engine.config.vocab_size * len(lens)
    return flops + per_token * tokens


def mixed_rows(engine, mixed: list[tuple[int, int]]) -> tuple[list[dict[str, object]], str]:  # noqa: ANN001
    """Steps as the server runs them while requests decode: D decode rows at 1K context, then one
    prefill chunk of C tokens (the scheduler's order: the decodes take the decode kernels), from the
    piecewise CUDA graphs and eagerly, against the D-row decode graph alone. `host ms` is the time
    to enqueue the step without waiting: near `step ms`, the host's launches bound the step."""
    from bench_decode import decode_batch, time_steps

    rows, prof = [], ""
    for chunk, d in mixed:
        decode, slots = decode_batch(engine, d, 1024)
        graph_ms = time_steps(engine, decode)
        slot = engine.pool.allocate(chunk)
        engine.pool.ensure_tokens(slot, chunk)
        prompt = torch.randint(0, engine.config.vocab_size, (chunk,)).tolist()
        decode_rows = [[t] for t in decode.input_ids.tolist()]
        batch = engine.make_batch(decode_rows + [prompt], [1024] * d + [0], slots + [slot])
        for mode, ms, host, chained in step_modes(engine, batch):
            rows.append({"step": f"{chunk} prefill + {d} decode, {mode}", "step ms": ms, "host ms": host,
                         "back-to-back ms": chained,
                         "decode-only graph ms": graph_ms,
                         "prefill tok/s (step - graph)": chunk / max(ms - graph_ms, 1e-3) * 1e3})
            print(rows[-1])
        if not prof:
            print(host_profile(engine, batch))
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                engine.forward_batch(batch)
                torch.cuda.synchronize()
            prof = (f"one {chunk} + {d} mixed step as served\n"
                    + p.key_averages().table(sort_by="cuda_time_total", row_limit=25))
        for s in [slot] + slots:
            engine.pool.free(s)
    return rows, prof


def back_to_back_ms(engine, batch, steps: int = 4) -> float:  # noqa: ANN001
    """Mean ms of a step enqueued while the GPU still runs the one before, as the server's overlap
    loop enqueues the next step: the host's launches before a step's first kernel, and wherever
    the host falls behind the GPU within a step, hide behind the queued work. A lone step (what
    time_steps times) starts from an idle GPU and an empty queue."""
    engine.forward_batch(batch)  # queued work when the timed steps begin
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        engine.forward_batch(batch)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def step_modes(engine, batch, steps: int = 5) -> list[tuple[str, float, float, float]]:  # noqa: ANN001
    """(mode, median step ms, fastest host ms to enqueue it, mean ms back to back) as served (the
    piecewise CUDA graphs, when the step fits them) and eagerly."""
    import time

    from bench_decode import time_steps

    graphs = engine.prefill_graphs
    modes = [("eager", None)]
    if graphs is not None and graphs.can_run(batch):
        modes.insert(0, (f"piecewise graphs (bucket {graphs.bucket(batch.num_tokens)})", graphs))
    out = []
    for mode, runner in modes:
        engine.prefill_graphs = runner
        try:
            ms = time_steps(engine, batch, steps=steps)
            torch.cuda.synchronize()
            host = []
            for _ in range(3):
                started = time.perf_counter()
                engine.forward_batch(batch)
                host.append((time.perf_counter() - started) * 1e3)
                torch.cuda.synchronize()
            chained = back_to_back_ms(engine, batch)
        finally:
            engine.prefill_graphs = graphs
        out.append((mode, ms, min(host), chained))
    return out


def op_profile(engine, batch) -> str:  # noqa: ANN001
    """One eager step's device time by the operator (and its Python caller) that launched it: which
    line of the model the elementwise kernels, copies and cats of the kernel table come from."""
    graphs, engine.prefill_graphs = engine.prefill_graphs, None
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                    with_stack=True) as profiler:
            engine.forward_batch(batch)
            torch.cuda.synchronize()
    finally:
        engine.prefill_graphs = graphs
    return profiler.key_averages(group_by_stack_n=4).table(sort_by="self_cuda_time_total", row_limit=40,
                                                           max_name_column_width=60)


def host_profile(engine, batch) -> str:  # noqa: ANN001
    """Where the host's time goes in one eager step: every call that synchronises with the device
    (torch's sync debug mode, with the caller's frames) and cProfile's top functions by own time
    and by cumulative time. A sync makes the host wait for the device, so host and kernel times
    add up instead of overlapping."""
    import cProfile
    import io
    import pstats
    import warnings

    syncs: list[str] = []

    def record(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        frames = [f for f in traceback.extract_stack()[:-2] if "minisgl" in f.filename or "fla" in f.filename]
        syncs.append(f"{message}: " + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in frames[::-1][:4]))

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.forward_batch(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    engine.forward_batch(batch)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    return f"{len(syncs)} host syncs in one step:\n" + "\n".join(syncs[:40]) + "\n" + text.getvalue()


def step_engine(model: str, layers: int | None, steps: list[PrefillStep], decode_batches: Sequence[int] = (),
                mixed: Sequence[tuple[int, int]] = (), piecewise_max_tokens: int | None = None,
                moe_backend: str = "auto"):  # noqa: ANN201
    """An engine on dummy FP8 weights of the known config `model` (cut to `layers` layers if given),
    its pool sized for the steps, the decode batches at 1K context and the mixed steps, with no
    warm-up ladder (minutes at 48 layers): each caller runs its steps once untimed first."""
    from minisgl.engine.args import EngineArgs
    from minisgl.engine.engine import Engine
    from minisgl.models.known_configs import config_dir

    decode_batches, mixed = list(decode_batches), list(mixed)
    path = config_dir(model, fp8=True, root=tempfile.mkdtemp())
    if layers is not None:
        cfg_file = os.path.join(path, "config.json")
        raw = json.load(open(cfg_file))
        raw["text_config"]["num_hidden_layers"] = layers
        raw["text_config"].pop("layer_types", None)
        json.dump(raw, open(cfg_file, "w"))
    slots_needed = max([s.requests for s in steps] + decode_batches + [d + 1 for _, d in mixed])
    longest = max([s.prefix + s.tokens for s in steps] + [c for c, _ in mixed])
    pages = max([s.requests * cdiv(s.prefix + s.tokens + 1, 64) for s in steps]
                + [b * cdiv(1024 + 2, 64) for b in decode_batches]
                + [cdiv(c, 64) + d * cdiv(1024 + 2, 64) for c, d in mixed])
    engine = Engine(resolve_plan(EngineArgs(path, load_format="dummy", context_length=longest + 64, page_size=64,
                               max_running_requests=slots_needed, num_pages=pages,
                               cuda_graph_max_bs=max(decode_batches + [d for _, d in mixed] or [1]),
                               disable_cuda_graph=not (decode_batches or mixed or piecewise_max_tokens),
                               piecewise_cuda_graph_max_tokens=piecewise_max_tokens, moe_backend=moe_backend)),
                    warm_up=False)
    print(f"engine: {model}, {engine.config.num_layers} layers, MoE backend {moe_backend}, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated")
    return engine


def allocate_step(engine, step: PrefillStep) -> tuple[list[int], list[list[int]]]:  # noqa: ANN001
    """(slots, random prompts) for one step: each request's slot holds its prefix and new tokens
    (the prefix's pages hold whatever was there: timing only)."""
    b, n, p = step.requests, step.tokens, step.prefix
    slots = [engine.pool.allocate(p + n) for _ in range(b)]
    for s in slots:
        engine.pool.ensure_tokens(s, p + n)
    return slots, [torch.randint(0, engine.config.vocab_size, (n,)).tolist() for _ in range(b)]


def model_rows(model: str, layers: int | None, steps: list[PrefillStep], decode_batches: list[int], ceiling: float,
               copy: float, mixed: list[tuple[int, int]], piecewise_max_tokens: int | None = None,
               group_tokens: Sequence[int] = (), halves: Sequence[bool] = (True,), moe_backend: str = "auto",
               ) -> tuple[list[dict[str, object]], list[dict[str, object]], str]:
    """Prefill steps of the engine (with each of group_tokens as the GDN rule's group bound, or the
    engine's own; lone prompts as halves or whole, for each of `halves`), then (same engine, CUDA
    graphs) decode steps at 1K context timed and rooflined as bench_decode.py does, to show the
    small-M paths did not regress, then the mixed steps of mixed_rows."""
    from bench_decode import decode_batch, profile_step, step_bytes, time_steps, touched_experts
    from minisgl import prefill_groups

    engine = step_engine(model, layers, steps, decode_batches, mixed, piecewise_max_tokens, moe_backend)
    layers = engine.config.num_layers
    rows, prof = [], ""
    for step in steps:
        b, n, p = step.requests, step.tokens, step.prefix
        slots, seqs = allocate_step(engine, step)
        flops = model_flops(engine, [n] * b, p)
        roof_ms = flops / (ceiling * 1e9)
        engine_bound, pair_min = prefill_groups.GROUP_TOKENS, prefill_groups.PAIR_MIN_TOKENS
        for bound, paired in itertools.product(group_tokens or [engine_bound], halves):
            # a batch takes its calls when first used
            prefill_groups.GROUP_TOKENS = bound
            prefill_groups.PAIR_MIN_TOKENS = pair_min if paired else b * n + 1
            try:
                batch = engine.make_batch(seqs, [p] * b, slots)
                label = f"{step}" if bound == engine_bound else f"{step}, GDN groups of <= {bound} tokens"
                label += "" if paired else ", lone prompts whole"
                for mode, ms, host, chained in step_modes(engine, batch, steps=3):  # each after 3 untimed (compiles)
                    rows.append({"layers": layers, "step": f"{label}, {mode}", "tokens": b * n, "step ms": ms,
                                 "host ms": host, "tokens/s": b * n / ms * 1e3, "back-to-back ms": chained,
                                 "back-to-back tok/s": b * n / chained * 1e3,
                                 "GFLOP/token": flops / (b * n) / 1e9, "roofline ms": roof_ms,
                                 "vs roofline": roof_ms / ms})
                    print(rows[-1])
            finally:
                prefill_groups.GROUP_TOKENS, prefill_groups.PAIR_MIN_TOKENS = engine_bound, pair_min
        batch = engine.make_batch(seqs, [p] * b, slots)
        # Every step's kernels (long prompts shift time to attention and the delta rule's serial
        # chunks); the first's also by launching operator.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
            engine.forward_batch(batch)
            torch.cuda.synchronize()
        prof += f"one {step} step\n" + profiler.key_averages().table(sort_by="cuda_time_total", row_limit=25) + "\n"
        if step == steps[0]:
            prof += f"\none {step} step, by the operator that launched each kernel\n" + op_profile(engine, batch)
        for s in slots:
            engine.pool.free(s)
    decode = []
    for b in decode_batches:
        context = 1024
        batch, slots = decode_batch(engine, b, context)
        for s in slots:
            engine.pool.state.ssm[:, s].normal_(std=0.1)  # a live recurrent state, as bench_decode.py's
        touched = touched_experts(engine, batch)
        ms = time_steps(engine, batch)
        nbytes = sum(step_bytes(engine, touched, b, context).values())
        decode.append({"layers": layers, "context": context, "B": b, "step ms": ms, "tokens/s": b / ms * 1e3,
                       "roofline ms": nbytes / (copy * 1e9), "vs roofline": nbytes / (copy * 1e9) / ms})
        print(decode[-1])
        if b == decode_batches[0]:
            prof += f"\none decode step, B={b} at 1K: " + profile_step(engine, batch) + "\n"
        for s in slots:
            engine.pool.free(s)
    mixed_table, mixed_prof = mixed_rows(engine, mixed)
    return rows + mixed_table, decode, prof + "\n" + mixed_prof
