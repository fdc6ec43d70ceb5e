"""Write tiny checkpoints to disk in the exact layout of the official Qwen checkpoints: bf16 tensors
(FP8 block-128 ones for the projections the FP8 checkpoints quantise) in two safetensors shards with
an index, and the config, generation config and tokenizer files beside them."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

import torch
from safetensors.torch import save_file

from minisgl.layers.fp8 import quantize_block_fp8
from minisgl.models.tiny import configs as cfgs
from minisgl.models.tiny.tokenizer import build_tiny_tokenizer

NUM_SHARDS = 2
INDEX = "model.safetensors.index.json"
# The projections that the official FP8 checkpoints store in float8; everything else stays bf16.
FP8_WEIGHT = re.compile(
    r"\.(linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|self_attn\.[qkvo]_proj"
    r"|mlp\.experts\.\d+\.(gate|up|down)_proj|mlp\.shared_expert\.(gate|up|down)_proj)\.weight$"
)


def to_disk(tensors: Iterable[tuple[str, torch.Tensor]], fp8: bool) -> dict[str, torch.Tensor]:
    """Cast to bf16 and, for an FP8 checkpoint, quantise the FP8 projections."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors:
        w = t.to(torch.bfloat16).contiguous()
        if fp8 and FP8_WEIGHT.search(name):
            # Quantise the bf16 values, as the official FP8 checkpoints were made from the bf16 ones.
            out[name], out[f"{name}_scale_inv"] = quantize_block_fp8(w, cfgs.FP8_BLOCK)
        else:
            out[name] = w
    return out


def write_shards(out_dir: str, tensors: dict[str, torch.Tensor]) -> None:
    """The tensors, split by bytes in model order into NUM_SHARDS files, and the index naming each one's file."""
    os.makedirs(out_dir, exist_ok=True)
    sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    total = sum(sizes.values())
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(NUM_SHARDS)]
    running = 0
    for name, t in tensors.items():
        shards[min(running * NUM_SHARDS // total, NUM_SHARDS - 1)][name] = t
        running += sizes[name]
    weight_map: dict[str, str] = {}
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{NUM_SHARDS:05d}.safetensors"
        path = os.path.join(out_dir, fname)
        save_file(shard, path, metadata={"format": "pt"})
        os.chmod(path, 0o644)  # safetensors creates files owner-only; the cache is meant to be shared
        weight_map.update({n: fname for n in shard})
    write_json(os.path.join(out_dir, INDEX),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_metadata(out_dir: str, config: dict, fp8: bool, tensor_names: Iterable[str]) -> None:
    """config.json (with the FP8 quantization_config naming the bf16 modules), generation_config.json
    and the tokenizer files of a checkpoint holding `tensor_names`."""
    if fp8:
        keep_bf16 = sorted(n.removesuffix(".weight") for n in tensor_names
                           if n.endswith(".weight") and not FP8_WEIGHT.search(n))
        config = {**config, "quantization_config": cfgs.fp8_quantization_config(keep_bf16)}
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), cfgs.generation_config())
    build_tiny_tokenizer(out_dir)
