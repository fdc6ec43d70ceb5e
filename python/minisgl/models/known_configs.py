"""The public Qwen3.5-MoE configs (from shared/reference), as full HF config.json dicts, so
presets, dry runs and random-weight benchmarks can use real shapes without a checkpoint
(`config_dir` gives a model path for `--load-format dummy`)."""
from __future__ import annotations

import copy
import json
import os
from typing import Any

_PATH = os.path.join(os.path.dirname(__file__), "qwen35_text_configs.json")


def _table() -> dict[str, Any]:
    with open(_PATH) as f:
        return json.load(f)


def known_models() -> list[str]:
    return sorted(k for k in _table() if k.startswith("Qwen"))


def hf_config(name: str, fp8: bool = False) -> dict[str, Any]:
    """A config.json dict as the official `Qwen3_5MoeForConditionalGeneration` checkpoints ship it."""
    table = _table()
    if name not in table or not name.startswith("Qwen"):
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known_models())}")
    common = copy.deepcopy(table["common"])
    quant = common.pop("fp8_quantization_config")
    text = {k: v for k, v in common.items() if k not in ("model_type", "text_model_type", "architectures")}
    text.update(table[name])
    text["model_type"] = common["text_model_type"]
    text["dtype"] = "bfloat16"
    raw: dict[str, Any] = {
        "architectures": common["architectures"],
        "model_type": common["model_type"],
        "text_config": text,
        "tie_word_embeddings": False,
    }
    if fp8:
        raw["quantization_config"] = quant
    return raw


def cache_root() -> str:
    """Where minisgl keeps what it builds (the tiny model, config-only model dirs): $MINISGL_CACHE,
    else ~/.cache/minisgl."""
    return os.environ.get("MINISGL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "minisgl")


def config_dir(name: str, fp8: bool = False, root: str | None = None) -> str:
    """A model directory holding only `name`'s config.json: a `--model-path` for `--load-format
    dummy`. Written under `root` (default: the minisgl cache) and reused."""
    root = root or cache_root()
    path = os.path.join(root, "configs", name + ("-FP8" if fp8 else ""))
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, f".config.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(hf_config(name, fp8), f, indent=2)
    os.replace(tmp, os.path.join(path, "config.json"))  # atomic: a concurrent reader sees a whole file
    return path
