"""Bad input gets a clear error, before anything is allocated."""
from __future__ import annotations

import json
import shutil

import pytest

from minisgl import LLM, SamplingParams
from minisgl.models.config import ConfigError


@pytest.fixture(scope="module")
def llm(tiny_checkpoints) -> LLM:
    return LLM(tiny_checkpoints["bf16"], dtype="float32", device="cpu", context_length=64, page_size=16)


def test_nonexistent_model_path() -> None:
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        LLM("/no/such/model", device="cpu")


def test_unsupported_architecture(tiny_checkpoints, tmp_path) -> None:
    dst = tmp_path / "llama"
    shutil.copytree(tiny_checkpoints["bf16"], dst)
    (dst / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError, match="unsupported architecture.*llama"):
        LLM(str(dst), device="cpu")


def _untouched(llm: LLM) -> None:
    pool = llm.engine.pool
    assert pool.free_pages == pool.total_pages and pool.free_slots == pool.num_slots
    assert not llm.scheduler.has_work


@pytest.mark.parametrize("prompt", ["", []])
def test_empty_prompt(llm: LLM, prompt) -> None:
    with pytest.raises(ValueError, match="empty"):
        llm.generate([prompt])
    _untouched(llm)


def test_over_long_prompt_rejected_before_allocation(llm: LLM) -> None:
    # The good prompt comes first: it must not be queued or run when a later one is bad.
    with pytest.raises(ValueError, match="prompt 1: This model's maximum context length is 64 tokens, and the prompt has 64"):
        llm.generate([[1, 2, 3], list(range(64))])
    _untouched(llm)


def test_token_outside_vocabulary(llm: LLM) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 10**6]])
    _untouched(llm)


def test_mismatched_sampling_params(llm: LLM) -> None:
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["hi"], [SamplingParams(), SamplingParams()])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_sampling_params_validation(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_engine_args(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        LLM(tiny_checkpoints["bf16"], device="cpu", attention_backend="nope")
    with pytest.raises(ValueError, match="dtype"):
        LLM(tiny_checkpoints["bf16"], device="cpu", dtype="int8")
