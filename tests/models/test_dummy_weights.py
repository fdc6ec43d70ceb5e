"""--load-format dummy: seeded random weights from a config.json alone (or a known config name), in
the model's dtypes, finite through a deep stack."""
from __future__ import annotations

import json
import os

import pytest
import torch

from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.models.config import load_config
from minisgl.models.known_configs import config_dir
from minisgl.models.tiny.configs import qwen35_moe_config


def _config_only(tmp_path, num_layers: int) -> str:
    path = tmp_path / f"cfg{num_layers}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(qwen35_moe_config(num_layers)))
    return str(path)


def _prefill_then_decode(engine: Engine, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    slot = engine.pool.allocate(len(prompt) + 1)
    engine.pool.ensure_tokens(slot, len(prompt) + 1)
    first = engine.forward_batch(engine.make_batch([prompt], [0], [slot]))
    token = int(first.argmax(-1)[0])
    second = engine.forward_batch(engine.make_batch([[token]], [len(prompt)], [slot]))
    engine.pool.free(slot)
    return first, second


def _engine(path: str, seed: int = 0) -> Engine:
    args = EngineArgs(path, load_format="dummy", device="cpu", seed=seed, page_size=8, max_running_requests=2,
                      context_length=64)
    return Engine(resolve_plan(args))


def test_dummy_from_config_only_is_seeded_and_finite(tmp_path) -> None:
    path = _config_only(tmp_path, 4)
    assert os.listdir(path) == ["config.json"]
    a = _prefill_then_decode(_engine(path), [5, 9, 11, 3])
    b = _prefill_then_decode(_engine(path), [5, 9, 11, 3])
    c = _prefill_then_decode(_engine(path, seed=1), [5, 9, 11, 3])
    for x, y in zip(a, b):
        assert torch.isfinite(x).all() and torch.equal(x, y)
    assert not torch.equal(a[0], c[0])


def test_dummy_activations_stay_finite_over_48_layers(tmp_path) -> None:
    engine = _engine(_config_only(tmp_path, 48))
    first, second = _prefill_then_decode(engine, list(range(3, 40)))
    for logits in (first, second):
        assert torch.isfinite(logits).all()
        # lm_head rows have std 1/sqrt(H) and the final norm gives unit RMS: logits std ~1.
        assert 0.3 < logits.std().item() < 3.0


def test_dummy_weights_scale_norms_and_matrices(tmp_path) -> None:
    engine = _engine(_config_only(tmp_path, 4))
    params = dict(engine.model.named_parameters())
    hidden = engine.config.hidden_size
    assert params["layers.0.input_layernorm.weight"].abs().max() < 0.2  # 1 + w norm: w near 0
    assert (params["layers.0.linear_attn.norm.weight"] - 1).abs().max() < 0.2  # plain norm: w near 1
    std = params["layers.0.linear_attn.in_proj_qkv.weight"].float().std().item()
    assert abs(std * hidden**0.5 - 1) < 0.1


@pytest.mark.parametrize("name", ["Qwen3.5-122B-A10B", "Qwen3.5-397B-A17B"])
def test_known_config_dir_is_a_model_path(tmp_path, name: str) -> None:
    config = load_config(config_dir(name, fp8=True, root=str(tmp_path)))
    assert config.quant is not None and config.quant.block == (128, 128)
    assert config.num_layers in (48, 60)
