"""Host time the AFD workers spend launching decode steps (enqueueing the work, from their replies):
the part of a step that CUDA graphs take off the host. On distinct GPUs an eager worker whose
launches take longer than its kernels is bound by the host."""
from __future__ import annotations

from collections import defaultdict


class LaunchTimes:
    def __init__(self) -> None:
        self._seconds: dict[str, float] = defaultdict(float)
        self._steps: dict[str, int] = defaultdict(int)

    def add(self, worker: str, seconds: float) -> None:
        self._seconds[worker] += seconds
        self._steps[worker] += 1

    def totals(self) -> dict[str, tuple[float, int]]:
        """worker -> (seconds, decode steps) so far."""
        return {w: (self._seconds[w], self._steps[w]) for w in self._steps}


def mean_ms_between(before: dict[str, tuple[float, int]], after: dict[str, tuple[float, int]]) -> dict[str, float]:
    """Each worker's mean launch time in ms over the decode steps between two totals()."""
    out = {}
    for w, (s, n) in after.items():
        s0, n0 = before.get(w, (0.0, 0))
        if n > n0:
            out[w] = round((s - s0) / (n - n0) * 1e3, 3)
    return out
