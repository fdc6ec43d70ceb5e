"""What one step feeds the gated delta rule, bundled once by the mixer for whichever backend runs it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from minisgl.gdn.reference_math import gdn_gates


@dataclass(frozen=True)
class DeltaInputs:
    """Per token (flat over the batch): q, k [T, H, K], v [T, HV, V] after the conv, and the raw gate
    projections a, b [T, HV]; per value head: the layer's A_log, dt_bias [HV]. qk_normed: q and k are
    L2-normalised per head already (the prefill conv did it), so the rule must not do it again."""

    q: Tensor
    k: Tensor
    v: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    qk_normed: bool = False

    def rows(self, start: int, end: int | None = None) -> "DeltaInputs":
        """The tokens [start, end) (views), with the layer's per-head parameters."""
        return replace(self, q=self.q[start:end], k=self.k[start:end], v=self.v[start:end], a=self.a[start:end],
                       b=self.b[start:end])

    def gates_from(self, rows: Tensor) -> "DeltaInputs":
        """The same inputs with a and b gathered from `rows` (q, k and v already in that order)."""
        return replace(self, a=self.a.index_select(0, rows), b=self.b.index_select(0, rows))

    def gates(self) -> tuple[Tensor, Tensor]:
        """(log-decay g, write strength beta) [T, HV], both fp32."""
        return gdn_gates(self.a, self.b, self.A_log, self.dt_bias)
