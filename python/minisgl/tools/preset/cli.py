"""`python -m minisgl.tools.preset`: every value an AFD throughput preset derives, in one place.

The shell presets (scripts/experiments/afd/qwen35/) fix the inputs; this computes the rest:
batches per GPU and micro-batch, graph buckets, pages, the auto-raised max batched tokens, the
prefill-step bracket, the profiling window and the memory per GPU. `--format text` is the dry run
(QWEN35_DRY_RUN=1); `--format shell` gives the same values as shell assignments for the driver.
Invalid inputs exit with status 2 and a message.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from dataclasses import dataclass

from minisgl.models.config import ModelConfig
from minisgl.models.known_configs import known_models
from minisgl.tools.preset.derive import Derived, PresetSpec, check_pool, check_window, derive, model_config
from minisgl.tools.preset.memory import GIB, MIB


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class RunContext:
    """What the shell knows and the arithmetic does not: placement, profiler, pool and run dir."""

    launcher: str = "local"
    profiler: str = "off"
    prompts: str = "-"
    prompts_sha256: str = "-"
    run_dir: str = "-"


def render_text(spec: PresetSpec, d: Derived, cfg: ModelConfig, source: str, ctx: RunContext) -> str:
    m = d.memory
    mode = "ping-pong" if spec.num_mb == 2 else "serialized baseline"
    rows = [
        ("model", f"{spec.model} {'FP8' if cfg.quant else 'BF16'} ({source})"),
        ("topology", (f"{spec.attn_workers} attention workers (DP {spec.attn_workers}, TP 1) + "
            f"{spec.expert_workers} expert workers (DP {spec.expert_workers}, EP {spec.expert_workers}); "
            f"launcher {ctx.launcher}")),
        ("micro-batches", f"{spec.num_mb} ({mode})"),
        ("global batch", spec.global_batch),
        ("batch per attention GPU", d.lane_batch),
        ("batch per micro-batch", d.mb_batch),
        ("decode graph buckets", " ".join(map(str, d.graph_buckets))),
        ("decode dispatch bucket", f"{d.decode_dispatch_bucket} tokens per micro-batch"),
        ("prompt / output tokens", f"{spec.input_len} / {spec.output_len}"),
        ("max_seq_len", d.max_seq_len),
        ("page_size", spec.page_size),
        ("pages per request", d.pages_per_request),
        ("max batched tokens", (f"{spec.max_batched_tokens} requested -> {d.max_batched_tokens} "
            f"(at least a full lane decode batch of {d.lane_batch})")),
        ("prefill steps", (f"[{d.prefill_low}, {d.prefill_high}] (chunks of {spec.input_len} prompt tokens .. "
            f"{d.max_seq_len} max_seq_len tokens, {d.max_batched_tokens} tokens per step)")),
        ("decode steps", d.decode_steps),
        ("profile window", (f"steps [{d.profile_start}, {d.profile_stop}] ({spec.profile_warmup} warm-up steps after "
            f"the high prefill estimate, {spec.profile_steps} measured); profiler {ctx.profiler}")),
        ("memory per request", (f"{m.request.total / MIB:.1f} MiB (SSM {m.request.ssm_state / MIB:.1f} + conv "
            f"{m.request.conv_state / MIB:.1f} + KV {m.request.kv / MIB:.1f} MiB)")),
        ("attention GPU memory", (f"{_gib(m.attn_weights)} weights + {_gib(m.attn_requests)} requests of "
            f"{spec.gpu_gib:g} GiB")),
        ("expert GPU memory", f"{_gib(m.expert_weights)} experts of {spec.gpu_gib:g} GiB"),
        ("memory ratio", f"{m.attn_ratio:.3f} attention GPU, {m.expert_ratio:.3f} expert GPU"),
        ("pending steps", f"{spec.pending_steps} (coordinator lead {spec.pending_steps + 1})"),
        ("dispatch dtype", spec.dispatch_dtype),
        ("prompt pool", ctx.prompts),
        ("prompt pool sha256", ctx.prompts_sha256),
        ("run dir", ctx.run_dir),
    ]
    return "\n".join(f"{k:<24} {v}" for k, v in rows)


def render_shell(spec: PresetSpec, d: Derived) -> str:
    values = {
        "PRESET_GLOBAL_BATCH": spec.global_batch,
        "PRESET_LANE_BATCH": d.lane_batch,
        "PRESET_MB_BATCH": d.mb_batch,
        "PRESET_MAX_SEQ_LEN": d.max_seq_len,
        "PRESET_PAGE_SIZE": spec.page_size,
        "PRESET_MAX_BATCHED_TOKENS": d.max_batched_tokens,
        "PRESET_PROFILE_START": d.profile_start,
        "PRESET_PROFILE_STOP": d.profile_stop,
    }
    return "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minisgl.tools.preset", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=known_models())
    p.add_argument("--model-path", help="a checkpoint whose config.json replaces the public one")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--num-mb", type=int, required=True)
    for f in dataclasses.fields(PresetSpec)[3:]:  # after model, global_batch, num_mb
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    for f in dataclasses.fields(RunContext):
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default)
    p.add_argument("--format", choices=["text", "shell"], default="text")
    ns = p.parse_args(argv)
    try:
        spec = PresetSpec(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(PresetSpec)})
        cfg, source = model_config(ns.model, ns.model_path)
        d = derive(spec, cfg)
        check_window(d)
        if ns.prompts != RunContext.prompts:
            check_pool(ns.prompts, spec)
    except (ValueError, OSError) as e:
        print(f"preset: error: {e}", file=sys.stderr)
        return 2
    ctx = RunContext(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(RunContext)})
    print(render_text(spec, d, cfg, source, ctx) if ns.format == "text" else render_shell(spec, d))
    return 0

