"""Engine and scheduler arguments, named as the SGLang flags are."""
from __future__ import annotations

from dataclasses import dataclass

from minisgl.arg_field import arg
from minisgl.attention.registry import ATTENTION_BACKENDS
from minisgl.gdn.registry import GDN_BACKENDS
from minisgl.kvcache.planner import DEFAULT_STATE_RATIO
from minisgl.moe.registry import MOE_BACKENDS
from minisgl.parallel.config import check_sizes
from minisgl.prefill_groups import GROUP_TOKENS

LOAD_FORMATS = ("auto", "dummy")
DTYPES = ("float32", "bfloat16", "float16")
# What vLLM also accepts (half, float) and the short names people type (bf16, fp16, fp32).
SSM_DTYPES = ("float32", "bfloat16")
# --kv-cache-dtype as SGLang spells it -> torch's name (auto: the activations' dtype). FP8 stores
# e4m3 codes with a scale of 1, as SGLang and vLLM do for checkpoints without K/V scales.
KV_CACHE_DTYPES = {"auto": None, "fp8_e4m3": "float8_e4m3fn", "bfloat16": "bfloat16", "bf16": "bfloat16",
                   "float16": "float16", "fp16": "float16"}
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}
CPU_MAX_RUNNING_REQUESTS = 16  # the CPU's default: no memory to measure, so a fixed, small pool
# The planner measures the activation peak, so what is left is headroom for allocator slack only.
DEFAULT_MEM_FRACTION = 0.95


@dataclass(frozen=True)
class EngineArgs:
    model_path: str | None = arg(None, "checkpoint directory (HF layout: config.json, *.safetensors, tokenizer); "
                                       "default: the embedded tiny model")
    load_format: str = arg("auto", "auto: the checkpoint's safetensors; dummy: seeded random weights from config.json "
                                   "alone (benchmarks at real shapes without a checkpoint)", LOAD_FORMATS)
    dtype: str = arg("auto", "weights and activations; auto: the checkpoint's dtype (half = fp16 = float16, "
                             "bf16 = bfloat16, float = fp32 = float32)", ("auto", *DTYPES, *DTYPE_ALIASES))
    device: str = arg("auto", "cpu, cuda or cuda:N; auto: cuda when available, else cpu")
    page_size: int = arg(64, "tokens per KV page")
    max_running_requests: int | None = arg(None, "most requests running at once (default: 16 on the CPU; on a GPU, "
                                                 "what the memory planner fits)")
    context_length: int | None = arg(None, "max tokens per request, prompt + output (default: the model's limit; on "
                                           "a GPU lowered to what fits)")
    num_pages: int | None = arg(None, "KV pages to allocate (default: on the CPU every slot can reach the context "
                                      "length; on a GPU the memory planner's; setting it pins the pool)")
    # 1024, measured on the served 122B (docs/benchmarks.md): with piecewise CUDA graphs a 1024-token
    # chunk costs as much per token as a 4096-token one, and keeps ITL P99 within 1.3x the median at
    # 8K/256 c=32 (4096: 7.8x), for 0.82x the total throughput and 5.5x the TTFT median there.
    chunked_prefill_size: int = arg(1024, "max prompt tokens of one request per step, and of all requests per step "
                                          "while few others decode (bounds the inter-token latency); in a step "
                                          "without decodes, budget no other prompt can take grows a request's chunk "
                                          f"up to {GROUP_TOKENS} tokens")
    prefill_tokens_per_request: int = arg(
        16, "while requests decode, prompt tokens a step may take for each request running or waiting, when "
            "that is more than --chunked-prefill-size (at most --max-prefill-tokens): a crowd of requests is "
            "admitted as fast as the GPU prefills, a few dozen keep one chunk a step (0: always one chunk)")
    attention_backend: str = arg("auto", "full-attention kernels; auto: torch on the CPU, triton on CUDA",
                                 ("auto", *ATTENTION_BACKENDS.names()))
    gdn_backend: str = arg("auto", "gated DeltaNet kernels; auto: torch on the CPU, fla when installed (else "
                                   "triton) on CUDA", ("auto", *GDN_BACKENDS.names()))
    moe_backend: str = arg("auto", "routed-expert kernels; auto: torch on the CPU, triton on CUDA",
                           ("auto", *MOE_BACKENDS.names()))
    mamba_ssm_dtype: str | None = arg(None, "dtype of the GDN recurrent state (default: the config's, fp32)",
                                      (*SSM_DTYPES, *(a for a, t in DTYPE_ALIASES.items() if t in SSM_DTYPES)))
    kv_cache_dtype: str = arg(
        "auto", "dtype of the full-attention layers' K/V cache: auto (the activations'), or fp8_e4m3 for half the "
                "bytes of bf16 a token (codes with a scale of 1; values beyond +-448 saturate)", tuple(KV_CACHE_DTYPES))
    seed: int = arg(0, "seed of sampling (requests without their own seed) and of dummy weights")
    disable_cuda_graph: bool = arg(False, "no CUDA graphs: decode and prefill steps run eagerly "
                                          "(--piecewise-cuda-graph-max-tokens must then be unset or 0)")
    enable_prefix_caching: bool = arg(
        True, "the prefix cache (colocated engines; AFD lanes run without): idle state slots and K/V pages keep "
              "what earlier requests fed, and a prompt that starts with it reuses its K/V and recurrent state; the "
              "prefill step that passes a point worth keeping (where prompts part, a chat turn's tail) writes the "
              "recurrent state there to an idle slot as it goes",
        negations=("--disable-radix-cache",))
    cuda_graph_max_bs: int | None = arg(None, "largest decode batch captured in a CUDA graph (default: "
                                              "--max-running-requests)")
    piecewise_cuda_graph_max_tokens: int | None = arg(
        None, "largest prefill or mixed step (in tokens) replayed from piecewise CUDA graphs: per token bucket, "
              "everything but attention and the GDN conv and delta rule is captured, which removes most of the "
              "host's launch cost (default: --chunked-prefill-size + 512; 0: off)")
    mem_fraction_static: float | None = arg(
        None, f"GPU: share of the memory left after the weights and the measured activation peak that the pool "
              f"(state slots, KV pages) takes (default {DEFAULT_MEM_FRACTION})", aliases=("--gpu-memory-utilization",))
    max_mamba_cache_size: int | None = arg(
        None, "state slots in all, SGLang's flag: the running requests' and those only the prefix cache keeps, "
              "so that a shared prompt stays cached while every running slot is busy (default: "
              "--max-running-requests and a sixteenth more, at least one; without the prefix cache, none more)")
    mamba_full_memory_ratio: float = arg(
        DEFAULT_STATE_RATIO, "GPU, without --max-running-requests: GDN state memory to KV memory in the pool, as "
                             "SGLang's flag (0.9: 47 percent of it for state slots; lower it for longer requests, raise "
                             "it for more concurrent short ones)")
    tp_size: int = arg(1, "tensor-parallel ranks: the model sharded over this many GPUs of the node, one process each")
    ep_size: int = arg(1, "expert-parallel groups over the TP ranks (divides --tp-size): each group owns "
                          "num_experts / ep_size experts, each expert split over tp_size / ep_size ranks")

    def __post_init__(self) -> None:
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.max_mamba_cache_size is not None and self.max_mamba_cache_size < 1:
            raise ValueError(f"max_mamba_cache_size must be >= 1, got {self.max_mamba_cache_size}")
        if self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1:
            raise ValueError(f"cuda_graph_max_bs must be >= 1, got {self.cuda_graph_max_bs}")
        check_sizes(self.tp_size, self.ep_size)
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1], got {self.mem_fraction_static}")
        if not 0 < self.mamba_full_memory_ratio < float("inf"):
            raise ValueError(f"mamba_full_memory_ratio must be > 0 and finite, got {self.mamba_full_memory_ratio}")
        if self.piecewise_cuda_graph_max_tokens is not None and self.piecewise_cuda_graph_max_tokens < 0:
            raise ValueError(f"piecewise_cuda_graph_max_tokens must be >= 0, got {self.piecewise_cuda_graph_max_tokens}")
        if self.disable_cuda_graph and self.piecewise_cuda_graph_max_tokens:
            raise ValueError("piecewise_cuda_graph_max_tokens needs CUDA graphs: drop disable_cuda_graph or set it to 0")
        if self.chunked_prefill_size < 1:
            raise ValueError(f"chunked_prefill_size must be >= 1, got {self.chunked_prefill_size}")
        if self.prefill_tokens_per_request < 0:
            raise ValueError(f"prefill_tokens_per_request must be >= 0, got {self.prefill_tokens_per_request}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        # Aliases become torch's names here, so every reader of the args sees one spelling.
        for name in ("dtype", "mamba_ssm_dtype"):
            object.__setattr__(self, name, DTYPE_ALIASES.get(getattr(self, name), getattr(self, name)))
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto, {', '.join(DTYPES)} or an alias ({', '.join(DTYPE_ALIASES)}), "
                             f"got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.mamba_ssm_dtype not in (None, *SSM_DTYPES):
            raise ValueError(f"mamba_ssm_dtype must be float32 or bfloat16, got {self.mamba_ssm_dtype!r}")
