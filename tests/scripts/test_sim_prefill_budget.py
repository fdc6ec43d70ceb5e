"""benchmarks/sim_prefill_budget.py on the CPU: its clock and ITL accounting on a case worked by
hand, and the property the budget rule was chosen for (docs/benchmarks.md, eleventh session)."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

from sim_prefill_budget import PROFILES, RULES, Profile, replay  # noqa: E402

IN_USE, ONE_X, FORMER = RULES  # the rule in use first, then the two it was chosen against


def test_one_request_by_hand() -> None:
    """A 6,000-token prompt alone: a chunk grown to 4,096 tokens by the budget nobody else takes
    (prefill_budget.lone_prompt_tokens), then the other 1,904 (yielding the first token), then two
    decodes; 1 ms a step whatever it holds: 4 steps, gaps of 1 ms between the 3 tokens."""
    figures = replay(Profile(1, 1, 6000, 3, 1.0, 0.0, 0.0), RULES[IN_USE])
    assert figures["duration s"] == pytest.approx(0.004)
    assert figures["ITL median ms"] == pytest.approx(1.0)
    assert figures["ITL P99 ms"] == pytest.approx(1.0)


def test_prompt_tokens_and_decodes_are_priced() -> None:
    """Two requests at once, 1,024-token prompts, 2 tokens each, 1 ms + 1 us a prompt token + 10 us a
    decode: one 2,048-token step (3.048 ms) gives both first tokens, one decode step of two (1.02 ms)
    the second ones."""
    figures = replay(Profile(2, 2, 1024, 2, 1.0, 1.0, 10.0), RULES[IN_USE])
    assert figures["duration s"] == pytest.approx((3.048 + 1.02) / 1e3)
    assert figures["ITL median ms"] == pytest.approx(1.02)


def test_rule_in_use_keeps_long_context_gain_and_bounds_waves_of_prompts() -> None:
    """Against the former rule, Long Context ends sooner; against the ramp from 1x the decodes,
    8K prompts arriving in waves of 64 keep their ITL P99 at or below the former rule's."""
    long_context = PROFILES["35B Long Context 32000/100 x100"]
    waves = PROFILES["122B 8K/256 c=64"]
    assert replay(long_context, RULES[IN_USE])["duration s"] < 0.98 * replay(long_context, RULES[FORMER])["duration s"]
    p99 = {name: replay(waves, RULES[name])["ITL P99 ms"] for name in (IN_USE, ONE_X, FORMER)}
    assert p99[IN_USE] <= p99[FORMER] < p99[ONE_X]


def test_a_larger_chunk_trades_inter_token_latency_for_duration() -> None:
    """--chunked-prefill-size replayed: on Long Context a whole-budget chunk ends sooner and makes
    every decode wait longer; 8K prompts arriving one by one keep their ITL P99 only with one chunk."""
    long_context, steady = PROFILES["35B Long Context 32000/100 x100"], PROFILES["122B 8K/256 c=32"]
    small, large = replay(long_context, RULES[IN_USE], 1024), replay(long_context, RULES[IN_USE], 16384)
    assert large["duration s"] < 0.95 * small["duration s"]
    assert large["ITL median ms"] > 2 * small["ITL median ms"]
    assert replay(steady, RULES[IN_USE], 16384)["ITL P99 ms"] > 3 * replay(steady, RULES[IN_USE], 1024)["ITL P99 ms"]
