"""Alignment metrics and the wire format, on hand-made replies in vLLM's shapes (no server)."""
from __future__ import annotations

import math

import pytest
from minisgl.tools.align.metrics import Gates, TokenScore, metrics, overall
from minisgl.tools.align.wire import (
    WireError,
    completion_ids,
    prompt_scores,
    sample_body,
    score_body,
)


def _s(rank: int, logprob: float = -0.5) -> TokenScore:
    return TokenScore(token_id=7, logprob=logprob, rank=rank, ref_top1=7 if rank == 1 else 8)


def test_metrics_worked_example() -> None:
    m = metrics([_s(1, -0.1), _s(1, -0.3), _s(4, -2.0), _s(250, -9.0)])
    assert (m.tokens, m.top1, m.top10, m.top100, m.max_rank) == (4, 0.5, 0.75, 0.75, 250)
    assert m.mean_rank == pytest.approx((1 + 1 + 4 + 250) / 4)
    assert m.mean_logprob == pytest.approx(-11.4 / 4)
    assert m.perplexity == pytest.approx(math.exp(11.4 / 4))
    assert m.first_non_top1 == 2


def test_overall_pools_tokens_and_takes_the_earliest_mismatch() -> None:
    total = overall([[_s(1), _s(1), _s(1), _s(2)], [_s(1), _s(3)], [_s(1)]])
    assert total.tokens == 7 and total.top1 == pytest.approx(5 / 7)
    assert total.first_non_top1 == 1
    assert overall([[_s(1)], [_s(1)]]).first_non_top1 is None


def test_gates() -> None:
    m = metrics([_s(1), _s(12)])
    assert Gates(min_top1=0.0, min_top10=0.5).failures(m) == []
    failures = Gates(min_top1=0.9, min_top10=1.0).failures(m)
    assert [f.split()[0] for f in failures] == ["top-1", "top-10"]


def test_request_bodies_are_greedy_token_id_prompts() -> None:
    body = sample_body("m", (1, 2, 3), 16)
    assert body["prompt"] == [1, 2, 3] and body["temperature"] == 0.0 and body["ignore_eos"]
    assert body["max_tokens"] == 16 and body["return_token_ids"]
    score = score_body("m", [1, 2, 3, 4])
    assert score["max_tokens"] == 0 and score["echo"] and score["prompt_logprobs"] >= 1


def test_completion_ids_come_from_return_token_ids() -> None:
    assert completion_ids({"token_ids": [5, 6]}) == [5, 6]
    assert completion_ids({"text": "ab", "logprobs": {"tokens": ["a", "b"]}}) is None


def _entry(token: int, logprob: float, rank: int, top1: int | None = None) -> dict:
    e = {str(token): {"logprob": logprob, "rank": rank, "decoded_token": "x"}}
    if top1 is not None and top1 != token:
        e[str(top1)] = {"logprob": -0.01, "rank": 1, "decoded_token": "y"}
    return e


def test_prompt_scores_reads_rank_logprob_and_top1() -> None:
    seq = [10, 11, 12, 13]
    choice = {"prompt_logprobs": [None, _entry(11, -0.2, 1), _entry(12, -0.1, 1), _entry(13, -3.0, 5, top1=99)],
              "prompt_token_ids": seq}
    scores = prompt_scores(choice, seq, start=2)
    assert scores == [TokenScore(12, -0.1, 1, 12), TokenScore(13, -3.0, 5, 99)]


def test_prompt_scores_checks_the_echo() -> None:
    seq = [10, 11, 12]
    plp = [None, _entry(11, -0.2, 1), _entry(12, -0.1, 1)]
    with pytest.raises(WireError, match="echoed different token ids"):
        prompt_scores({"prompt_logprobs": plp, "prompt_token_ids": [10, 11, 99]}, seq, 1)
    with pytest.raises(WireError, match="other tokens"):  # no prompt_token_ids: membership is the check
        prompt_scores({"prompt_logprobs": [None, _entry(11, -0.2, 1), _entry(77, -0.1, 1)]}, seq, 1)
    with pytest.raises(WireError, match="prompt_logprobs"):
        prompt_scores({"text": ""}, seq, 1)
