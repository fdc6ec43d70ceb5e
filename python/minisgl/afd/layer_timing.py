"""Per-layer timing of AFD workers (`--afd-layer-timing-dir DIR`), off by default.

When off the workers hold no timer and pass `marks=None`: no clock is read and no event recorded.
When on, each launched step gets a StepMarks; the worker marks points of its layer loop, and at
retire (after the step's work is done, so no extra sync) the timer writes one JSON file per step
and worker: `DIR/step{step:06d}-{worker}.json` with the marks in µs since the step began.

Clocks: CUDA events on GPUs (elapsed times on one device; devices are never compared), the
monotonic clock on the CPU, which every process on a host shares: there the record also carries
`origin_ns`, the step's "begin" on that clock, so transfers can be timed across processes. `minisgl.tools.pipeline.measured` turns the files into per-layer
T_a, T_e, waits and transfer times, and the simulator's prediction next to the measured step.

Marks written (layer, micro-batch, name):
- attention worker: (-1, -1, "begin"), (-1, -1, "embedded"); per layer l and micro-batch i,
  (l, i, "combined") once layer l-1's result is in (for l = 0, at once) and (l, i, "dispatched")
  after the mixer, router, send and shared expert; then (L, i, "combined"), (L, i, "logits"); and
  (-1, -1, "end") after sampling.
- expert worker: (-1, -1, "begin"); per (l, i): "received", "computed", "sent"; (-1, -1, "end").
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

CPU_CLOCK, CUDA_CLOCK = "monotonic", "cuda"


class StepMarks:
    """One step's marks on one worker; the timestamps resolve to µs only once the step is done."""

    def __init__(self, step: int, cuda: bool, meta: dict[str, Any]) -> None:
        self.step = step
        self.cuda = cuda
        self.meta = meta
        self._marks: list[tuple[int, int, str, Any]] = []
        self.mark(-1, -1, "begin")

    def mark(self, layer: int, mb: int, name: str) -> None:
        if self.cuda:
            stamp: Any = torch.cuda.Event(enable_timing=True)
            stamp.record()
        else:
            stamp = time.monotonic_ns()
        self._marks.append((layer, mb, name, stamp))

    @property
    def origin_ns(self) -> int | None:
        return None if self.cuda else self._marks[0][3]

    def resolved(self) -> list[tuple[int, int, str, float]]:
        """(layer, mb, name, µs since "begin"); on a GPU, call after the step's work has finished."""
        first = self._marks[0][3]
        if self.cuda:
            return [(l, mb, n, first.elapsed_time(ev) * 1e3) for l, mb, n, ev in self._marks]
        return [(l, mb, n, (ns - first) / 1e3) for l, mb, n, ns in self._marks]


class LayerTimer:
    def __init__(self, out_dir: str, worker: str, device: torch.device, info: dict[str, Any]) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir = out_dir
        self.worker = worker
        self.cuda = device.type == "cuda"
        self.info = info  # facts fixed for the run: role, layer kinds, M:N, ...

    def start(self, step: int, **meta: Any) -> StepMarks:
        return StepMarks(step, self.cuda, meta)

    def write(self, marks: StepMarks) -> None:
        record = dict(
            worker=self.worker, step=marks.step, clock=CUDA_CLOCK if self.cuda else CPU_CLOCK,
            origin_ns=marks.origin_ns, **self.info, **marks.meta, marks=marks.resolved(),
        )
        path = os.path.join(self.out_dir, f"step{marks.step:06d}-{self.worker}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)  # a reader never sees half a file


def make_timer(out_dir: str | None, worker: str, device: torch.device, **info: Any) -> LayerTimer | None:
    return None if out_dir is None else LayerTimer(out_dir, worker, device, info)
