"""The offline API as vLLM's users call it: LLM(model=...), SamplingParams.n, LLM.chat, and the
progress bar of generate (use_tqdm)."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from minisgl import LLM, SamplingParams
from minisgl.startup_checks import ModelPathError

ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=128)


@pytest.fixture(scope="module")
def llm(tiny_checkpoints) -> LLM:
    return LLM(model=tiny_checkpoints["trained"], **ENGINE)


def test_model_keyword(tiny_checkpoints) -> None:
    with pytest.raises(ValueError, match="give the model once"):
        LLM(tiny_checkpoints["trained"], model=tiny_checkpoints["bf16"], **ENGINE)
    with pytest.raises(ModelPathError, match="does not exist"):
        LLM(model="/no/such/model")
    with pytest.raises(ModelPathError, match="huggingface-cli download"):
        LLM(model="Qwen/Qwen3.5-122B-A10B")


def test_model_keyword_loads_that_model(llm: LLM, tiny_checkpoints) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    positional = LLM(tiny_checkpoints["trained"], **ENGINE)
    assert llm.generate("def f(", greedy, use_tqdm=False)[0].token_ids == \
        positional.generate("def f(", greedy, use_tqdm=False)[0].token_ids


def test_n_samples(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=11, n=3)
    a, b = llm.generate(["import os", "class A:"], params, use_tqdm=False)
    assert [o.index for o in a.outputs] == [0, 1, 2] and len(b.outputs) == 3
    assert all(len(o.token_ids) == 10 for o in a.outputs + b.outputs)
    assert len({o.token_ids for o in a.outputs}) == 3  # each sample its own stream (seed + j)
    # Sample j is the single request with seed 11 + j: reproducible, and independent of the batch.
    for j in range(3):
        one = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=11 + j)
        assert llm.generate("import os", one, use_tqdm=False)[0].token_ids == a.outputs[j].token_ids
    assert a.token_ids == a.outputs[0].token_ids and a.text == a.outputs[0].text
    llm.scheduler.check_integrity()
    with pytest.raises(ValueError, match="n must be >= 1"):
        SamplingParams(n=0)


def test_chat_matches_the_template(llm: LLM, tiny_checkpoints) -> None:
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (chat,) = llm.chat(messages, greedy, use_tqdm=False)
    hf = AutoTokenizer.from_pretrained(tiny_checkpoints["trained"])  # the reference rendering
    ids = hf.encode(hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)
    assert chat.prompt_token_ids == tuple(ids)
    assert chat.token_ids == llm.generate([ids], greedy, use_tqdm=False)[0].token_ids
    two = llm.chat([messages, [{"role": "user", "content": "hi"}]], greedy, use_tqdm=False)
    assert len(two) == 2 and two[0].token_ids == chat.token_ids


def test_progress_bar(llm: LLM, capsys: pytest.CaptureFixture[str]) -> None:
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, n=2)
    llm.generate(["a", "b", "c"], params)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "3/3" in err  # counts prompts, not their samples
    llm.generate(["a"], params, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err
