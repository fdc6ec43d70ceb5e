"""benchmarks/serve_matrix.py end to end on the CPU (its smoke matrix on the embedded tiny model),
so the one-device-call GPU run cannot fail on the script itself; and its full-vocabulary tokenizer."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from full_vocab_tokenizer import SPECIALS, write_full_vocab_tokenizer  # noqa: E402

from minisgl.tokenizer.tokenizer import load_tokenizer  # noqa: E402
from server_harness import _free_port  # noqa: E402


def test_full_vocab_tokenizer_decodes_every_id(tmp_path) -> None:
    write_full_vocab_tokenizer(str(tmp_path), vocab_size=70_000, first_special_id=69_990)
    tok = load_tokenizer(str(tmp_path))
    assert len(tok) == 70_000
    assert [tok.convert_ids_to_tokens(69_990 + i) for i in range(3)] == list(SPECIALS)
    # Merged tokens are printable ASCII: each decodes to visible text on its own.
    assert all(tok.decode([i]).strip() for i in (300, 9000, 69_989, 69_993))


@pytest.mark.load
def test_smoke_matrix_runs_and_reports(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "serve_matrix.py"), "--matrix", "smoke",
         "--out", str(tmp_path), "--port", str(_free_port())],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "serve_matrix_smoke.json").read_text())
    assert [r["row"]["name"] for r in report["rows"]] == ["first request after ready", "16/8 c=4"]
    assert all(r["failed"] == 0 and r["completed"] == r["row"]["num_prompts"] for r in report["rows"])
    assert report["rows"][1]["total_output_tokens"] == 8 * 8
    assert report["compiles_after_ready"] == 0 and report["ready_seconds"] > 0
