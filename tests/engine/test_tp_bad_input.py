"""Parallel layouts that cannot work are refused with a clear error before any weight loads and
before any process starts: a TP size that does not divide the heads, an EP size that does not
divide the experts (or the TP size), more ranks than devices, an FP8 block cut by a TP split."""
from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch

from minisgl import LLM
from minisgl.afd.args import AfdArgs
from minisgl.engine.args import EngineArgs
from minisgl.models.known_configs import hf_config
from minisgl.models.tiny.make import make_tiny_model


def _config_only(tmp_path, name: str, raw: dict) -> str:
    """A model directory with a config.json and no weights: loading any would fail with another error."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(raw))
    return str(path)


@pytest.fixture
def tiny_config(tiny_checkpoints) -> dict:
    with open(os.path.join(tiny_checkpoints["bf16"], "config.json")) as f:
        return json.load(f)


def _refused(path: str, match: str, **kwargs: object) -> None:
    with pytest.raises(ValueError, match=match):
        LLM(path, device=kwargs.pop("device", "cpu"), **kwargs)
    assert not mp.active_children(), "a rank was started before the layout was checked"


def test_tp_size_not_dividing_heads(tmp_path, tiny_config) -> None:
    path = _config_only(tmp_path, "m", tiny_config)
    _refused(path, "--tp-size 3 does not divide the model's 4 attention heads", tp_size=3)


def test_ep_size_not_dividing_experts(tmp_path, tiny_config) -> None:
    tiny_config["text_config"]["num_experts"] = 6
    path = _config_only(tmp_path, "m", tiny_config)
    _refused(path, "--ep-size 4 does not divide the model's 6 routed experts", tp_size=4, ep_size=4)


def test_ep_size_must_divide_tp_size() -> None:
    with pytest.raises(ValueError, match="ep_size 2 must divide tp_size 1"):
        EngineArgs(ep_size=2)


def test_gdn_heads_must_divide(tmp_path, tiny_config) -> None:
    path = _config_only(tmp_path, "m", tiny_config)  # 2 GDN key heads
    _refused(path, "--tp-size 4 does not divide the model's 2 GDN key heads", tp_size=4)


def test_kv_heads_that_cannot_replicate_evenly(tmp_path) -> None:
    raw = hf_config("Qwen3.5-122B-A10B")
    raw["text_config"].update(num_attention_heads=24, num_key_value_heads=3, linear_num_key_heads=12,
                              linear_num_value_heads=48, vocab_size=248256)
    path = _config_only(tmp_path, "m", raw)
    _refused(path, "3 KV heads cannot be replicated evenly over --tp-size 4", tp_size=4, load_format="dummy")


def test_more_ranks_than_devices(tiny_checkpoints) -> None:
    first = torch.cuda.device_count()  # starting past the last device: never enough, on any host
    _refused(tiny_checkpoints["bf16"], f"--tp-size 2 needs 2 CUDA devices starting at cuda:{first}, but this host has "
             f"{first}", tp_size=2, device=f"cuda:{first}")


def test_fp8_tp_that_cuts_a_block(tmp_path) -> None:
    # The 122B's expert intermediate (1024) splits into whole 128-blocks up to TP 8, not at TP 16.
    path = _config_only(tmp_path, "m", hf_config("Qwen3.5-122B-A10B", fp8=True))
    _refused(path, "--tp-size 16 would cut the FP8 checkpoint's 128-wide weight blocks", tp_size=16,
             load_format="dummy")


def test_tiny_fp8_checkpoint_cannot_split(tiny_checkpoints) -> None:
    # Its heads are 64 wide: a TP 2 share of k_proj is half a 128-row block.
    _refused(tiny_checkpoints["fp8"], "--tp-size 2 would cut the FP8 checkpoint's 128-wide weight blocks", tp_size=2)


def test_afd_lane_tp_not_dividing_heads(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="--afd-attn-tp-size 3 does not divide the model's 4 attention heads"):
        LLM(tiny_checkpoints["bf16"], afd=AfdArgs(attn_tp_size=3), device="cpu")
    assert not mp.active_children()


def test_colocated_tp_flag_with_afd(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="with --afd, shard each attention lane with --afd-attn-tp-size"):
        LLM(tiny_checkpoints["bf16"], afd=AfdArgs(), tp_size=2, device="cpu")
    assert not mp.active_children()
