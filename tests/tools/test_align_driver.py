"""The alignment driver end to end on the tiny checkpoint (CPU): colocated vs HF in process,
AFD 2+2 vs a colocated minisgl server as the reference, and a candidate with the wrong weights
failing its gate.

The session's live minisgl server (tests/server_harness.py, the embedded tiny model) is the
colocated server; the driver starts the AFD and the wrong-weights candidates itself.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.tools.align.prompt_pool import build_pool, write_pool
from minisgl.models.tiny.default import default_model_path
from minisgl.models.tiny.make import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "scripts/validate/qwen35_fp8_alignment_driver.sh"
NUM_PROMPTS, PROMPT_LEN, NEW_TOKENS = 4, 16, 16


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("align-pool") / "pool.jsonl"
    tok = load_tokenizer(default_model_path())
    write_pool(str(path), build_pool(tok, str(ROOT / "python/minisgl"), NUM_PROMPTS, PROMPT_LEN, seed=0), tok)
    return path


def _drive(tmp_path: Path, pool: Path, **knobs: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AFD_", "REFERENCE", "CANDIDATE", "PROMPT"))}
    env |= {"OMP_NUM_THREADS": "1", "PROMPT_FILE": str(pool), "NUM_PROMPTS": str(NUM_PROMPTS),
            "PROMPT_LEN": str(PROMPT_LEN), "MAX_NEW_TOKENS": str(NEW_TOKENS), "CONCURRENCY": str(NUM_PROMPTS),
            "RUN_DIR": str(tmp_path / "run"), "STARTUP_TIMEOUT": "120", **knobs}
    try:
        r = subprocess.run([str(DRIVER)], env=env, capture_output=True, text=True, timeout=240, check=False)
    except subprocess.TimeoutExpired as e:  # the driver's EXIT trap never ran: stop the servers it started
        for pid in re.findall(r"started \w+ \(pid (\d+)", str(e.stderr or "")):
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise
    report = tmp_path / "run" / "alignment.json"
    return r, json.loads(report.read_text()) if report.exists() else {}


def test_colocated_vs_hf(tmp_path: Path, pool: Path, live_server) -> None:
    r, report = _drive(tmp_path, pool, MODEL_PATH=default_model_path(), CANDIDATE="url", CANDIDATE_URL=live_server.url,
                       REFERENCE="hf")
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["passed"] and report["overall"]["tokens"] == NUM_PROMPTS * NEW_TOKENS
    assert report["reference"]["kind"] == "hf" and "PASS" in r.stdout


def test_afd_2_2_vs_colocated_server(tmp_path: Path, pool: Path, live_server) -> None:
    r, report = _drive(tmp_path, pool, MODEL_PATH=default_model_path(),
                       AFD_ATTN_WORKERS="2", AFD_EXPERT_WORKERS="2", AFD_NUM_MB="2",
                       REFERENCE="url", REFERENCE_URL=live_server.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["passed"] and report["overall"]["top10"] == 1.0
    assert report["reference"]["url"] == live_server.url
    assert "--afd-attn-workers 2 --afd-expert-workers 2 --afd-num-mb 2" in r.stderr  # the candidate's flags


def test_wrong_weights_fail_the_gate(tmp_path: Path, pool: Path, live_server) -> None:
    wrong = make_tiny_model(str(tmp_path / "wrong"), seed=7)  # the same model, other random weights
    r, report = _drive(tmp_path, pool, MODEL_PATH=wrong, REFERENCE="url",
                       REFERENCE_URL=live_server.url)
    assert r.returncode == 1, r.stdout + r.stderr
    assert not report["passed"] and report["overall"]["top10"] < 0.5
    assert "FAIL: top-10 hit rate" in r.stdout
