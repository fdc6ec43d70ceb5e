"""Schemathesis over the live server's /openapi.json, with every check it has (conformance included:
status codes, content types, headers and bodies as declared, 405 with Allow, schema-invalid
requests refused), through its command line so that the coverage phase (methods, edge values)
runs as well as fuzzing. positive_data_acceptance is replaced by a stricter check of our own
(tests/schemathesis_hooks.py): a schema-valid request may be refused only for a limit no schema
can state.

Bounded: MINISGL_SCHEMATHESIS_EXAMPLES fuzzed cases per operation (default CI_EXAMPLES), and CI
runs the fuzzing phase only (the coverage phase alone is ~600 cases, ~100 s here; the 405s it
probes are tested in test_server_reliability.py); valid requests are clamped to a few tokens.
The long run of the issue (>= 20,000 cases, every phase):
    MINISGL_SCHEMATHESIS_EXAMPLES=7000 MINISGL_SCHEMATHESIS_PHASES=coverage,fuzzing \
        MINISGL_SCHEMATHESIS_WORKERS=3 python -m pytest -q -s tests/server/test_server_schemathesis.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server_harness import Server

CI_EXAMPLES = 30
EXAMPLES = int(os.environ.get("MINISGL_SCHEMATHESIS_EXAMPLES", CI_EXAMPLES))
SEED = int(os.environ.get("MINISGL_SCHEMATHESIS_SEED", 0))
PHASES = os.environ.get("MINISGL_SCHEMATHESIS_PHASES", "fuzzing")
WORKERS = int(os.environ.get("MINISGL_SCHEMATHESIS_WORKERS", 1))  # up to one per operation
REQUEST_TIMEOUT_S = 60
MAX_RESPONSE_S = 30  # `all` checks response times; a clamped request answers in well under 1 s here
SECONDS_PER_CASE = 1.0  # only bounds the run: 0.15-0.45 s per case measured on a busy 2-core machine


def test_schema_conformance(live_server: Server, tmp_path: Path) -> None:
    report = tmp_path / "schemathesis.json"
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", live_server.url + "/openapi.json",
           "--checks", "all", "--exclude-checks", "positive_data_acceptance", "--max-examples", str(EXAMPLES),
           "--seed", str(SEED), "--phases", PHASES, "--continue-on-failure", "--workers", str(WORKERS),
           "--request-timeout", str(REQUEST_TIMEOUT_S), "--max-response-time", str(MAX_RESPONSE_S),
           "--report", "json", "--report-json-path", str(report)]
    tests = str(Path(__file__).parents[1])
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    timeout = max(300.0, 4 * EXAMPLES * SECONDS_PER_CASE)  # four operations' worth: three POSTs and the GETs
    # In tmp_path: the command line keeps a cache of its own in the working directory.
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    summary = json.loads(report.read_text())
    cases = summary["test_cases"]
    assert out.returncode == 0 and cases["with_failures"] == 0 and cases["errored"] == 0, out.stdout[-12000:]
    assert summary["operations"]["tested"] == summary["operations"]["total"] >= 7
    assert all(summary["phases"][p]["status"] == "success" for p in PHASES.split(",")), summary["phases"]
    assert cases["generated"] >= 3 * EXAMPLES, cases  # three POST operations, at least
    print(f"\nschemathesis ({PHASES}, seed {SEED}): {cases['generated']} cases, {cases['with_failures']} failures, "
          f"{summary['running_time']:.0f} s")


def test_still_healthy_and_clean(live_server: Server) -> None:
    stats = live_server.wait_idle()
    assert (stats["used_pages"], stats["used_slots"]) == (0, 0)
    assert live_server.get("/server_info").json()["requests_in_flight"] == 0
    assert live_server.get("/health").status_code == 200
