"""benchmarks/prefill_steps.py's step syntax and attention FLOPs, on the CPU: a GPU run must not
fail on parsing, and the roofline must count a long prompt's later chunks' keys."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

from prefill_steps import PrefillStep, attention_flops  # noqa: E402


def test_steps_parse_with_and_without_a_prefix() -> None:
    assert PrefillStep.parse("16x1024") == PrefillStep(16, 1024, 0)
    assert PrefillStep.parse("2x8192@24576") == PrefillStep(2, 8192, 24576)
    assert str(PrefillStep(2, 8192, 24576)) == "2 x 8192 after 24576"
    assert PrefillStep.parse("1x8@") == PrefillStep(1, 8, 0)  # an empty prefix is none
    for bad in ("16", "16x", "ax1024", "1x8@p"):
        with pytest.raises(ValueError):
            PrefillStep.parse(bad)


def test_attention_flops_count_every_key_a_token_sees() -> None:
    heads, dim = 3, 8
    for tokens, prefix in ((1, 0), (5, 0), (4, 7), (16, 100)):
        keys = sum(prefix + i for i in range(1, tokens + 1))  # token i sees the prefix and itself
        assert attention_flops(heads, dim, tokens, prefix) == 2 * 2 * heads * dim * keys
