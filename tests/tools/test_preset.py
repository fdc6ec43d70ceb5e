"""The throughput presets' derived values: the arithmetic on worked examples, and the two
documented batches (397B b320, 122B b400) pinned."""
from __future__ import annotations

import pytest
from minisgl.models.config import parse_config
from minisgl.models.known_configs import hf_config
from minisgl.tools.preset.derive import PresetSpec, check_window, derive, prefill_steps
from minisgl.tools.preset.memory import MIB

Q397, Q122 = "Qwen3.5-397B-A17B", "Qwen3.5-122B-A10B"


def _derive(model: str, batch: int, num_mb: int = 2, **kw):
    return derive(PresetSpec(model, batch, num_mb, **kw), parse_config(hf_config(model, fp8=True)))


def test_prefill_bracket_worked_example() -> None:
    # 80 requests, 16384 tokens per step: two 8192-token prompts fit a step, one 9216-token chunk does.
    assert prefill_steps(80, 8192, 16384) == 40
    assert prefill_steps(80, 9216, 16384) == 80
    # A chunk larger than the budget takes ceil(chunk / budget) steps of its own.
    assert prefill_steps(3, 20000, 16384) == 6
    assert prefill_steps(1, 1, 1) == 1


@pytest.mark.parametrize("model,batch,lane,mb,buckets,low,high,window", [
    (Q397, 320, 80, 40, (1, 2, 4, 8, 16, 24, 32, 40), 40, 80, (88, 152)),
    (Q122, 400, 100, 50, (1, 2, 4, 8, 16, 24, 32, 40, 48, 50), 50, 100, (108, 172)),
])
def test_documented_presets(model, batch, lane, mb, buckets, low, high, window) -> None:
    d = _derive(model, batch)
    assert (d.lane_batch, d.mb_batch, d.graph_buckets) == (lane, mb, buckets)
    assert (d.max_seq_len, d.pages_per_request, d.max_batched_tokens, d.decode_dispatch_bucket) == (9216, 144, 16384, 64)
    assert (d.prefill_low, d.prefill_high, d.decode_steps) == (low, high, 1024)
    assert (d.profile_start, d.profile_stop) == window


def test_122b_batch_holds_the_397b_request_memory() -> None:
    """The 122B batch is derived so each attention GPU holds the same bytes of request state and KV
    as the 397B preset: 397B has 1.25x the GDN and attention layers at equal per-layer sizes."""
    m397, m122 = _derive(Q397, 320).memory, _derive(Q122, 400).memory
    assert m397.request.ssm_state == 180 * MIB and m122.request.ssm_state == 144 * MIB
    assert m397.request.kv == 9216 * 30 * 1024 and m122.request.kv == 9216 * 24 * 1024
    assert m397.attn_requests == m122.attn_requests
    assert 0.3 < m122.attn_ratio < m397.attn_ratio < 0.35


def test_max_batched_tokens_is_raised_to_a_full_lane_decode_batch() -> None:
    d = _derive(Q122, 400, max_batched_tokens=64)
    assert d.max_batched_tokens == 100
    assert d.prefill_low == 100 * 82  # each 8192-token prompt takes ceil(8192 / 100) steps
    # So small a budget leaves no step where the whole batch decodes: the window is refused.
    with pytest.raises(ValueError, match="profile window"):
        check_window(d)


@pytest.mark.parametrize("num_mb,batch,match", [(3, 320, "num_mb must be 1"), (2, 322, "does not split evenly")])
def test_refuses_other_micro_batches_and_uneven_batches(num_mb, batch, match) -> None:
    with pytest.raises(ValueError, match=match):
        _derive(Q397, batch, num_mb)


def test_refuses_a_window_past_the_first_finish() -> None:
    check_window(_derive(Q397, 320))
    with pytest.raises(ValueError, match="profile window"):
        check_window(_derive(Q397, 320, output_len=128))
