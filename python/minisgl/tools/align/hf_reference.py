"""The in-process reference: HF transformers on the same checkpoint, scoring teacher-forced."""
from __future__ import annotations

import json
import os
from typing import Any

import torch
from minisgl.scheduler.logprobs import compute_logprobs
from minisgl.tools.align.candidate import Sample
from minisgl.tools.align.metrics import TokenScore
from minisgl.tools.align.reference import teacher_forced
from transformers import AutoModelForCausalLM, FineGrainedFP8Config


def _is_fp8(model_path: str) -> bool:
    with open(os.path.join(model_path, "config.json")) as f:
        raw = json.load(f)
    quant = raw.get("quantization_config") or raw.get("text_config", {}).get("quantization_config") or {}
    return quant.get("quant_method") == "fp8"


class HfReference:
    """transformers' own model class and loader, so no minisgl code sits between the checkpoint and
    the reference. FP8 checkpoints are dequantised on load (transformers needs accelerate for that);
    on CUDA the model is spread over the visible GPUs."""

    def __init__(self, model_path: str, dtype: str) -> None:
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if _is_fp8(model_path):
            kwargs["quantization_config"] = FineGrainedFP8Config(dequantize=True)
        if torch.cuda.is_available():
            kwargs["device_map"] = "auto"
        self.model_path, self.dtype = model_path, dtype
        self.model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, **kwargs).eval()
        self.device = next(self.model.parameters()).device

    @torch.inference_mode()
    def _one(self, s: Sample) -> list[TokenScore]:
        seq, start = teacher_forced(s)
        logits = self.model(torch.tensor([seq], device=self.device)).logits[0, start - 1 : -1]
        lp = compute_logprobs(logits, torch.tensor(seq[start:], device=self.device), k=1).map(torch.Tensor.cpu)
        return [TokenScore(t, lp.logprob[i].item(), int(lp.rank[i]), int(lp.top_ids[i, 0]))
                for i, t in enumerate(seq[start:])]

    def score(self, samples: list[Sample]) -> list[list[TokenScore]]:
        return [self._one(s) for s in samples]

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "model_path": self.model_path, "dtype": self.dtype}

    def close(self) -> None:
        del self.model
