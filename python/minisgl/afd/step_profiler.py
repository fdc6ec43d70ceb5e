"""Step-windowed profiling of the AFD workers, driven by the environment the throughput presets set:
MINISGL_PROFILE=nsys|torch, MINISGL_PROFILE_STEPS=START:STOP, MINISGL_PROFILE_DIR=DIR.

nsys: cudaProfilerStart/Stop around the window (run under `nsys profile --capture-range=cudaProfilerApi`).
torch: torch.profiler over the window, written as a Chrome trace DIR/<worker>.json.
"""
from __future__ import annotations

import os

import torch

MODES = ("nsys", "torch")


class StepProfiler:
    def __init__(self, mode: str, start: int, stop: int, out_dir: str, worker: str) -> None:
        if mode not in MODES:
            raise ValueError(f"MINISGL_PROFILE must be one of {MODES}, got {mode!r}")
        if not 0 <= start < stop:
            raise ValueError(f"MINISGL_PROFILE_STEPS must be START:STOP with 0 <= START < STOP, got {start}:{stop}")
        self.mode, self.start, self.stop, self.out_dir, self.worker = mode, start, stop, out_dir, worker
        self._torch_prof: torch.profiler.profile | None = None

    @staticmethod
    def from_env(worker: str) -> "StepProfiler | None":
        mode = os.environ.get("MINISGL_PROFILE")
        if not mode:
            return None
        start, _, stop = os.environ.get("MINISGL_PROFILE_STEPS", "").partition(":")
        if not (start.isdigit() and stop.isdigit()):
            raise ValueError("MINISGL_PROFILE needs MINISGL_PROFILE_STEPS=START:STOP")
        return StepProfiler(mode, int(start), int(stop), os.environ.get("MINISGL_PROFILE_DIR", "."), worker)

    def before_step(self, step: int) -> None:
        if step == self.start:
            if self.mode == "nsys":
                torch.cuda.profiler.start()
            else:
                self._torch_prof = torch.profiler.profile(record_shapes=False)
                self._torch_prof.__enter__()
        elif step == self.stop:
            self.finish()

    def finish(self) -> None:
        if self.mode == "nsys":
            if torch.cuda.is_available():
                torch.cuda.profiler.stop()
        elif self._torch_prof is not None:
            self._torch_prof.__exit__(None, None, None)
            os.makedirs(self.out_dir, exist_ok=True)
            self._torch_prof.export_chrome_trace(os.path.join(self.out_dir, f"{self.worker}.json"))
            self._torch_prof = None
