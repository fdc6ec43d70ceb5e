"""benchmarks/afd_ipc_probe.py on the CPU: it refuses cleanly without CUDA, and turns kernel
stamps into round trips without counting the host's gap between chunks. (The probe itself runs
only on a GPU; its figures go to docs/afd.md.)"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "afd_ipc_probe.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from afd_ipc_probe import NO_CUDA, chunk_intervals_us, summary  # noqa: E402


def test_without_cuda_it_exits_with_the_reason_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "ipc.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(out)], env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert NO_CUDA in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_round_trips_are_gaps_within_chunks() -> None:
    # Two warm-up stamps, then two chunks of three; the 79 us gap between the chunks is the host's.
    stamps = [0, 5_000, 10_000, 12_000, 20_000, 99_000, 100_000, 103_000]
    assert chunk_intervals_us(stamps, warmup=2, chunk=3, chunks=2) == [2.0, 8.0, 1.0, 3.0]
    assert chunk_intervals_us(stamps, warmup=2, chunk=3, chunks=1) == [2.0, 8.0]


def test_summary_is_median_and_nearest_rank_p99() -> None:
    samples = [float(x) for x in range(200, 0, -1)]  # 1..200, unsorted
    assert summary(samples) == {"n": 200, "median_us": 100.5, "p99_us": 198.0, "max_us": 200.0}
    assert summary([]) == {"n": 0}
