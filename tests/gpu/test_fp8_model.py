"""FP8 models end to end on the GPU: a real-width `--load-format dummy` FP8 model captures its decode
graphs and decodes finite logits. The tiny FP8 checkpoint against the CPU reference on its
dequantised weights is in test_trained_model.py, on the trained model: a random model's logits are
too often near-tied for a tight bar (0.904 teacher-forced top-1 here, against 0.887 for the CPU
reference with the kernels' activation rounding emulated).
"""
from __future__ import annotations

import json

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.layers.fp8 import FP8_DTYPE
from minisgl.models.known_configs import hf_config

pytestmark = pytest.mark.gpu


def test_dummy_fp8_model_at_122b_width_decodes_finite(tmp_path) -> None:
    raw = hf_config("Qwen3.5-122B-A10B", fp8=True)
    raw["text_config"]["num_hidden_layers"] = 4  # 3 GDN + 1 full attention, real widths
    (tmp_path / "config.json").write_text(json.dumps(raw))
    engine = Engine(resolve_plan(EngineArgs(str(tmp_path), load_format="dummy", page_size=64, max_running_requests=8,
                               context_length=1024, cuda_graph_max_bs=8)))
    assert engine.graph_runner is not None
    experts = engine.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == FP8_DTYPE and experts.gate_up_proj_scale_inv is not None
    slots = [engine.pool.allocate(300) for _ in range(5)]
    for s in slots:
        engine.pool.ensure_tokens(s, 300)
    prompts = [torch.randint(0, 248320, (200 + 10 * i,)).tolist() for i in range(5)]
    first = engine.forward_batch(engine.make_batch(prompts, [0] * 5, slots))
    tokens = first.argmax(-1).tolist()
    decode = engine.make_batch([[t] for t in tokens], [len(p) for p in prompts], slots)
    graphed = engine.forward_batch(decode)
    assert torch.isfinite(first).all() and torch.isfinite(graphed).all()
    assert 0.3 < graphed.std().item() < 3.0  # logits of a unit-RMS hidden state (dummy_weights.py)
