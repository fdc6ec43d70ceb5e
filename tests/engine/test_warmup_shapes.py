"""The warm-up's mixed steps include the most prompt tokens a step may take beside the decodes."""
from __future__ import annotations

from minisgl.engine.warmup import StepShape, mixed_shapes


def test_mixed_shapes_hold_the_largest_step_beside_decodes() -> None:
    shapes = mixed_shapes(4, 100, 4096, beside_most=250)
    assert StepShape((1,) * 4 + (100, 100, 50), (37,) * 4 + (0, 0, 0)) in shapes
    assert max(s.num_tokens for s in shapes) == 254


def test_no_extra_step_when_one_chunk_is_the_most() -> None:
    shapes = mixed_shapes(4, 100, 4096, beside_most=100)
    assert max(s.num_tokens for s in shapes) == 104
    assert all(len(s.extend) <= 5 for s in shapes)
