"""The sampling defaults a checkpoint ships in generation_config.json, applied as vLLM applies them:
to every field a request does not set (served), or to the SamplingParams the offline LLM uses
when it is given none. `--generation-config ignore` (or vLLM's `vllm`) turns them off; a folder
path reads that folder's generation_config.json instead of the model's.

The values the file names are used as written. `do_sample: false` is not read as greedy (vLLM
does not either); it and the other decoding controls minisgl has no equivalent for are listed as
not applied when the defaults are logged.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from minisgl.sampling_params import SamplingParams

# generation_config.json key -> SamplingParams field.
FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "max_new_tokens": "max_tokens",
}
_NOT_APPLIED = ("do_sample", "num_beams", "typical_p", "epsilon_cutoff", "eta_cutoff", "no_repeat_ngram_size",
                "length_penalty", "min_new_tokens", "min_length", "max_length", "top_h", "diversity_penalty")
OFF = ("ignore", "vllm")


@dataclass(frozen=True)
class SamplingDefaults:
    values: tuple[tuple[str, Any], ...] = ()  # (SamplingParams field, value)
    not_applied: tuple[str, ...] = ()
    source: str | None = None

    def get(self, field: str, fallback: Any) -> Any:
        return dict(self.values).get(field, fallback)

    def params(self, **fields: Any) -> SamplingParams:
        """SamplingParams from these defaults, `fields` taking precedence."""
        return SamplingParams(**{**dict(self.values), **fields})

    def describe(self) -> str:
        if self.source is None:
            return "no generation_config sampling defaults"
        applied = ", ".join(f"{k}={v}" for k, v in self.values) or "none"
        text = f"sampling defaults from {self.source} (for requests that do not set them): {applied}"
        return text + (f"; not applied: {', '.join(self.not_applied)}" if self.not_applied else "")


def load_sampling_defaults(model_path: str, mode: str = "auto") -> SamplingDefaults:
    """mode: "auto" (the model's generation_config.json), "ignore"/"vllm" (none), or a folder."""
    if mode in OFF:
        return SamplingDefaults()
    folder = model_path if mode == "auto" else mode
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        if mode != "auto":
            raise ValueError(f"--generation-config {mode!r}: no generation_config.json there")
        return SamplingDefaults()
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    values = {FIELDS[k]: v for k, v in raw.items() if k in FIELDS and v is not None}
    if values.get("top_k") == 0:  # 0 is "off" in HF's and vLLM's reading alike
        values["top_k"] = -1
    try:
        SamplingParams(**{"max_tokens": 1, **values})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: unusable sampling defaults: {e}") from None
    return SamplingDefaults(tuple(values.items()), tuple(k for k in _NOT_APPLIED if k in raw), path)
