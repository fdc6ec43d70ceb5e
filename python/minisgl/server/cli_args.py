"""Dataclass <-> argparse: one `--kebab-case` flag per field of EngineArgs, SchedulerArgs and
ServerArgs, so the flags never drift from the dataclasses."""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import TypeVar

from minisgl.engine.args import EngineArgs

T = TypeVar("T")

_HELP = {
    "model_path": "checkpoint directory (HF layout); default: the embedded tiny model",
    "context_length": "max tokens per request (prompt + output)",
    "num_pages": "KV pages to allocate (default: the CPU, every slot can reach the context length; a GPU, "
                 "the memory planner's; setting it pins the pool)",
    "max_running_requests": "most requests running at once (default: 16 on the CPU; on a GPU, what fits)",
    "chunked_prefill_size": "max prompt tokens of one request per step, and of all requests per step while "
                            "others decode (bounds the inter-token latency)",
    "max_prefill_tokens": "max prompt tokens of all requests per step",
    "mem_fraction_static": "GPU: share of the memory left after the weights and the measured activation peak "
                           "that the pool (state slots, KV pages) takes (default 0.95)",
    "cuda_graph_max_bs": "largest decode batch captured in a CUDA graph (default: --max-running-requests)",
    "tp_size": "tensor-parallel ranks: the model sharded over this many GPUs of the node, one process each",
    "ep_size": "expert-parallel groups over the TP ranks (divides --tp-size): each group owns num_experts / ep_size "
               "experts, each expert split over tp_size / ep_size ranks",
    "attn_tp_size": "tensor-parallel ranks (GPUs) of each attention lane; only each lane's rank 0 talks to the "
                    "expert workers",
    "served_model_name": "the model name clients send (default: the model path)",
    "watchdog_timeout": "seconds one step may take before the engine counts as hung and is stopped",
    "reasoning_parser": "qwen3: the <think> block of chat answers goes to reasoning_content",
    "tool_call_parser": "qwen3_coder: enables tools in chat; Qwen3.5 XML tool calls go to tool_calls",
    "generation_config": "sampling defaults for requests that leave fields unset: auto (the model's "
                         "generation_config.json), ignore (or vllm: none), or a folder holding one",
    "api_key": "require `Authorization: Bearer KEY` on /v1/* and the admin routes (/health, /metrics stay open)",
    "max_queued_requests": "choices that may wait beyond the running slots; more get 503 with Retry-After "
                           "(default: %(default)s)",
    "max_request_body_bytes": "larger request bodies get 413 (default: %(default)s)",
    "body_read_timeout": "seconds a client may take to send its request body, else 408 (default: %(default)s)",
    "max_logprob_entries": "logprob entries (token + alternatives, prompt and output, all choices) one request may "
                           "produce, else 400 (default: %(default)s)",
}


# Other engines' names for the same flag, so their command lines work unchanged.
_ALIASES = {"mem_fraction_static": ("--gpu-memory-utilization",)}


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "") -> None:
    """--{prefix}{field} for each field (prefix "afd_" gives --afd-attn-workers)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        flags = ("--" + (prefix + f.name).replace("_", "-"), *_ALIASES.get(prefix + f.name, ()))
        help_text = _HELP.get(f.name, f"default: {f.default}")
        dest = prefix + f.name
        if base is bool:  # --flag / --no-flag: type=bool would read "false" as True
            parser.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            parser.add_argument(*flags, dest=dest, type=base, default=f.default, help=help_text)


def dataclass_from(ns: argparse.Namespace, cls: type[T], prefix: str = "") -> T:
    return cls(**{f.name: getattr(ns, prefix + f.name) for f in dataclasses.fields(cls)})


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, EngineArgs)


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    return dataclass_from(ns, EngineArgs)
