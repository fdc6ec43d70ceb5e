"""What an AFD throughput preset derives from its inputs (tools/preset/cli.py prints it): batches
per GPU and micro-batch, graph buckets, pages, the auto-raised max batched tokens, the prefill-step
bracket, the profiling window and the memory per GPU (memory.py)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from minisgl.engine.graph import decode_buckets
from minisgl.kvcache.pages import _num_pages
from minisgl.models.config import ModelConfig, load_config, parse_config
from minisgl.models.known_configs import hf_config
from minisgl.tools.align.prompt_pool import read_pool
from minisgl.tools.preset.memory import MemoryPlan, memory_plan

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
