"""Engine and scheduler arguments, named as the SGLang flags are."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.parallel.config import check_sizes

LOAD_FORMATS = ("auto", "dummy")
CPU_MAX_RUNNING_REQUESTS = 16  # the CPU's default: no memory to measure, so a fixed, small pool
# The planner measures the activation peak, so what is left is headroom for allocator slack only.
DEFAULT_MEM_FRACTION = 0.95


@dataclass(frozen=True)
class EngineArgs:
    model_path: str | None = None  # None = the embedded tiny default model
    load_format: str = "auto"  # auto = the checkpoint's safetensors; dummy = seeded random weights (config.json only)
    dtype: str = "auto"  # auto = the checkpoint's dtype
    device: str = "auto"  # auto = cuda when available, else cpu
    page_size: int = 64
    max_running_requests: int | None = None  # None: 16 on the CPU; on a GPU, what the memory planner fits
    context_length: int | None = None  # max tokens per request; None: the model's limit (on a GPU, lowered to what fits)
    num_pages: int | None = None  # KV pages; None: every slot can reach the context (CPU), the planner's (GPU)
    chunked_prefill_size: int = 1024  # prompt tokens per request per step; per step while others decode
    attention_backend: str = "auto"  # auto = torch on the CPU, triton on CUDA
    gdn_backend: str = "auto"  # auto = torch on the CPU; fla when installed, else triton, on CUDA
    moe_backend: str = "auto"  # auto = torch on the CPU, triton on CUDA
    mamba_ssm_dtype: str | None = None  # None = the config's mamba_ssm_dtype (fp32)
    seed: int = 0
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None  # None: every batch size up to max_running_requests
    # On a GPU, the share of memory left after the weights and the measured activation peak that the
    # pool (state slots, KV pages) may take. None: DEFAULT_MEM_FRACTION. Alias: --gpu-memory-utilization.
    mem_fraction_static: float | None = None
    # Tensor parallelism: one process per rank (this one is rank 0 and runs the scheduler).
    tp_size: int = 1
    # Expert parallelism over the TP ranks: experts split into ep_size groups, each expert's
    # intermediate dim over the tp_size / ep_size ranks of its group.
    ep_size: int = 1

    def __post_init__(self) -> None:
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError(f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}")
        check_sizes(self.tp_size, self.ep_size)
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1], got {self.mem_fraction_static}")
        if self.chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size must be >= 1, got {self.chunked_prefill_size}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.mamba_ssm_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"mamba_ssm_dtype must be float32 or bfloat16, got {self.mamba_ssm_dtype!r}")
