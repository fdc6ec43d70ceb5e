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
import math
import os
import shlex
import sys
from dataclasses import dataclass

from minisgl.engine.graph import decode_buckets
from minisgl.kvcache.pages import _num_pages
from minisgl.models.config import ModelConfig, load_config, parse_config
from minisgl.models.known_configs import hf_config, known_models
from minisgl.tools.align_pool import read_pool
from minisgl.tools.preset_memory import GIB, MIB, MemoryPlan, memory_plan

H200_GIB = 139.0  # what an H200 offers to torch, about


@dataclass(frozen=True)
class PresetSpec:
    model: str
    global_batch: int
    num_mb: int
    attn_workers: int = 4
    expert_workers: int = 4
    input_len: int = 8192  # prompt tokens, exactly (the pool's prompt length)
    output_len: int = 1024  # decode tokens per request (EOS ignored)
    page_size: int = 64
    max_batched_tokens: int = 16384  # requested prefill tokens per lane step
    pending_steps: int = 2
    dispatch_dtype: str = "fp8"
    profile_warmup: int = 8  # steps after the high prefill estimate before the window opens
    profile_steps: int = 64
    gpu_gib: float = H200_GIB

    def __post_init__(self) -> None:
        if self.num_mb not in (1, 2):
            raise ValueError(f"num_mb must be 1 (serialized) or 2 (ping-pong), got {self.num_mb}")
        if self.global_batch % (self.attn_workers * self.num_mb):
            raise ValueError(f"global batch {self.global_batch} does not split evenly over {self.attn_workers} "
                             f"attention workers x {self.num_mb} micro-batches")
        for name in ("input_len", "output_len", "page_size", "max_batched_tokens", "pending_steps", "profile_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def prefill_steps(requests: int, chunk: int, budget: int) -> int:
    """Steps to prefill `requests` chunks of `chunk` tokens at `budget` tokens per step, packing
    whole chunks into a step (a chunk larger than the budget takes ceil(chunk / budget) steps)."""
    if chunk <= budget:
        return math.ceil(requests / (budget // chunk))
    return requests * math.ceil(chunk / budget)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class Derived:
    lane_batch: int  # requests per attention GPU (= --max-running-requests of a lane)
    mb_batch: int  # requests per micro-batch
    graph_buckets: tuple[int, ...]
    decode_dispatch_bucket: int  # token rows per micro-batch message at decode (a power of two)
    max_seq_len: int
    pages_per_request: int
    max_batched_tokens: int  # raised so a full lane decode batch fits one step's dispatch
    prefill_low: int
    prefill_high: int
    decode_steps: int
    profile_start: int
    profile_stop: int
    memory: MemoryPlan


def derive(spec: PresetSpec, cfg: ModelConfig) -> Derived:
    lane = spec.global_batch // spec.attn_workers
    mb = lane // spec.num_mb
    max_seq_len = spec.input_len + spec.output_len
    raised = max(spec.max_batched_tokens, lane)
    low = prefill_steps(lane, spec.input_len, raised)
    high = prefill_steps(lane, max_seq_len, raised)
    start = high + spec.profile_warmup
    if cfg.num_experts % spec.expert_workers:
        raise ValueError(f"{cfg.num_experts} experts do not split over {spec.expert_workers} expert workers")
    return Derived(
        lane_batch=lane,
        mb_batch=mb,
        graph_buckets=tuple(decode_buckets(mb)),
        decode_dispatch_bucket=next_pow2(mb),
        max_seq_len=max_seq_len,
        pages_per_request=_num_pages(max_seq_len, spec.page_size),
        max_batched_tokens=raised,
        prefill_low=low,
        prefill_high=high,
        decode_steps=spec.output_len,
        profile_start=start,
        profile_stop=start + spec.profile_steps,
        memory=memory_plan(cfg, lane, max_seq_len, spec.page_size, spec.expert_workers, spec.gpu_gib),
    )


def check_window(d: Derived) -> None:
    """The window must see the whole batch decoding: after every prefill (the high estimate) and
    before the first requests admitted finish (their decode steps)."""
    if d.profile_stop > d.decode_steps:
        raise ValueError(f"profile window [{d.profile_start}, {d.profile_stop}] runs past the {d.decode_steps} decode "
                         f"steps of the first requests: lower the profile steps, or raise the output length or "
                         f"the max batched tokens")


def check_pool(path: str, spec: PresetSpec) -> None:
    """The run sends the pool's first global_batch prompts; each must have exactly input_len tokens."""
    prompts = read_pool(path, spec.global_batch)
    if len(prompts) < spec.global_batch:
        raise ValueError(f"prompt pool {path} has {len(prompts)} prompts; the preset sends {spec.global_batch}")
    bad = next((p for p in prompts if len(p.token_ids) != spec.input_len), None)
    if bad is not None:
        raise ValueError(f"prompt pool {path}: prompt {bad.id} has {len(bad.token_ids)} tokens, not {spec.input_len}")


def model_config(name: str, model_path: str | None) -> tuple[ModelConfig, str]:
    """A checkpoint's config.json wins; without one, the public config of `name` (FP8)."""
    if model_path and os.path.isfile(os.path.join(model_path, "config.json")):
        return load_config(model_path), f"{model_path}/config.json"
    return parse_config(hf_config(name, fp8=True)), "public config"


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


if __name__ == "__main__":
    sys.exit(main())
