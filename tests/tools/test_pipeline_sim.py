"""The AFD pipeline simulator: MegaScale-Infer's closed form on uniform layers, and the bubble
accounting of a two-layer (GDN, full) step worked out by hand."""
from __future__ import annotations

import pytest

from minisgl.tools.pipeline.sim import (
    EXPERT, FULL, GDN, TAIL, LaneCosts, StepSpec, closed_form_applies, megascale_closed_form, simulate,
)


def _uniform(t_a: float, t_e: float, t_c: float, layers: int, m: int, lanes: int = 1) -> StepSpec:
    lane = LaneCosts(attn={GDN: (t_a,) * m})
    return StepSpec((GDN,) * layers, m, (lane,) * lanes, {GDN: (t_e,) * m}, t_c, t_c)


@pytest.mark.parametrize(
    "t_a,t_e,t_c,layers,m",
    [(10, 10, 2, 8, 3), (10, 6, 1, 5, 2), (6, 10, 1, 5, 2), (10, 10, 5, 4, 3), (7, 13, 3, 12, 4), (5, 5, 0, 1, 2)],
)
def test_closed_form_on_uniform_layers(t_a, t_e, t_c, layers, m) -> None:
    assert closed_form_applies(t_a, t_e, t_c, m)
    for lanes in (1, 3):  # identical lanes: the fan-in changes nothing
        got = simulate(_uniform(t_a, t_e, t_c, layers, m, lanes)).step
        assert got == pytest.approx(megascale_closed_form(t_a, t_e, t_c, layers, m))


def test_one_micro_batch_serializes() -> None:
    assert not closed_form_applies(10, 10, 2, 1)
    assert simulate(_uniform(10, 6, 2, 4, 1)).step == pytest.approx(4 * (10 + 6 + 2 * 2))


def test_closed_form_fails_when_the_ring_is_too_short() -> None:
    # (m-1)·T_f = 10 < 2·T_c + min = 14: the slower side starves, so the step is longer.
    assert not closed_form_applies(10, 10, 2, 2)
    assert simulate(_uniform(10, 10, 2, 4, 2)).step > megascale_closed_form(10, 10, 2, 4, 2)


def test_hand_worked_two_layer_bubbles() -> None:
    """GDN then full, m = 2, T_a(GDN) 2, T_a(full) 6, T_e 3, T_c 1.

    AG:  A(0,0) 0-2, A(0,1) 2-4, idle 4-7 (combine (0,0) back at 7: GDN), A(1,0) 7-13,
         A(1,1) 13-19 (combine (0,1) back at 10), idle 19-24 (combine (1,1) back at 24: full).
    EG:  idle 0-3 (GDN), E(0,0) 3-6, E(0,1) 6-9, idle 9-14 (full), E(1,0) 14-17,
         idle 17-20 (full), E(1,1) 20-23, idle 23-24 (tail).
    """
    spec = StepSpec(
        (GDN, FULL), 2, (LaneCosts(attn={GDN: (2, 2), FULL: (6, 6)}),), {GDN: (3, 3), FULL: (3, 3)}, 1, 1,
    )
    r = simulate(spec)
    assert r.step == 24
    assert r.ag_idle == {GDN: 3, FULL: 5}
    assert r.eg_idle == {GDN: 3, FULL: 8, TAIL: 1}
    assert r.busy("attn0") == 16 and r.busy(EXPERT) == 12
    experts = [(s.layer, s.mb, s.start, s.end) for s in r.spans if s.what == "expert"]
    assert experts == [(0, 0, 3, 6), (0, 1, 6, 9), (1, 0, 14, 17), (1, 1, 20, 23)]


def test_fan_in_waits_for_the_slowest_lane_and_shared_runs_after_the_send() -> None:
    fast = LaneCosts(attn={GDN: (1,)}, shared={GDN: (4,)})
    slow = LaneCosts(attn={GDN: (3,)})
    r = simulate(StepSpec((GDN,), 1, (fast, slow), {GDN: (2,)}, 1, 1))
    # The dispatch leaves the slow lane at 3 and arrives at 4; E 4-6; combine back at 7.
    assert r.step == 7
    assert r.eg_idle[GDN] == 4
    assert r.ag_idle[GDN] == pytest.approx((2 + 4) / 2)  # fast lane idle 5-7, slow lane 3-7


def test_invalid_specs_are_rejected() -> None:
    lane = LaneCosts(attn={GDN: (1, 1)})
    with pytest.raises(ValueError, match="needs 2 costs"):
        StepSpec((GDN,), 2, (lane,), {GDN: (1,)}, 0, 0)
    with pytest.raises(ValueError, match="no attention or expert cost"):
        StepSpec((GDN, FULL), 2, (lane,), {GDN: (1, 1)}, 0, 0)
