"""The shell entry points under scripts/: syntax and shellcheck, the throughput presets' refusals
and dry runs (pinned against docs/qwen35_presets.md), the alignment presets' equivalence to
calling the driver directly, and the prompt pool's SHA-256 on a fixed source."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(ROOT.glob("scripts/**/*.sh"))
AFD_DIR = ROOT / "scripts/experiments/afd/qwen35"
THROUGHPUT = {
    "397b": AFD_DIR / "run_afd_qwen35_397b_a17b_fp8_8k_b320_2node_mb2_nsys_alignment.sh",
    "122b": AFD_DIR / "run_afd_qwen35_122b_a10b_fp8_8k_b400_2node_mb2_nsys_alignment.sh",
}
DRIVER = ROOT / "scripts/validate/qwen35_fp8_alignment_driver.sh"
# Each preset, and the knobs it sets: the direct call passes exactly these to the driver.
ALIGNMENT_PRESETS = {
    "scripts/validate/qwen35_122b_a10b_fp8_fastafd_alignment.sh": {
        "AFD_ATTN_WORKERS": "2", "AFD_EXPERT_WORKERS": "2", "AFD_NUM_MB": "2", "AFD_DISPATCH_DTYPE": "fp8",
        "PROMPT_LEN": "1024", "NUM_PROMPTS": "64", "MAX_NEW_TOKENS": "256", "CONCURRENCY": "64",
        "REFERENCE": "vllm", "VLLM_ARGS": "--tensor-parallel-size 4",
    },
    "scripts/validate/qwen35_397b_a17b_fp8_fastafd_alignment.sh": {
        "AFD_ATTN_WORKERS": "4", "AFD_EXPERT_WORKERS": "4", "AFD_NUM_MB": "2", "AFD_DISPATCH_DTYPE": "fp8",
        "PROMPT_LEN": "1024", "NUM_PROMPTS": "64", "MAX_NEW_TOKENS": "128", "CONCURRENCY": "32",
        "REFERENCE": "vllm", "VLLM_ARGS": "--tensor-parallel-size 8",
    },
    "scripts/quickstart/qwen35_sample.sh": {
        "REFERENCE": "none", "NUM_PROMPTS": "8", "PROMPT_LEN": "256", "MAX_NEW_TOKENS": "64",
    },
}
# Bash's own bookkeeping, which differs between a preset that execs the driver and a direct call.
BASH_VARS = {"_", "SHLVL"}
# Dry-run lines that name this machine's files rather than derived values.
LOCAL_LINES = ("prompt pool", "prompt pool sha256", "run dir")
# generate_prompts.py on the fixed source below with the tiny tokenizer; a change here means the
# pool format, the cutting or the tiny tokenizer changed.
TEST_POOL_SHA256 = "a6f93a07f8dbf975affe62c22e9e84399607f1a18614f8d2654a2916555fb1ee"


def _run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def test_bash_syntax() -> None:
    assert SCRIPTS, "no scripts found"
    for script in SCRIPTS:
        r = _run(["bash", "-n", str(script)], dict(os.environ))
        assert r.returncode == 0, f"{script}: {r.stderr}"


def test_shellcheck() -> None:
    if shutil.which("shellcheck") is None:
        print("shellcheck is not installed (.ci/run installs Debian's package)")
        pytest.skip("shellcheck is not installed (.ci/run installs Debian's package)")
    r = _run(["shellcheck", *map(str, SCRIPTS)], dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr


def _no_nsys_path() -> str:
    path = "/usr/bin:/bin"
    if shutil.which("nsys", path=path):
        pytest.skip("nsys is installed in /usr/bin: cannot test the NSYS=1 refusal")
    return path


@pytest.mark.parametrize("preset", sorted(THROUGHPUT))
@pytest.mark.parametrize("knobs,message", [
    ({}, "AFD_NUM_MB has no default"),
    ({"AFD_NUM_MB": "3"}, "AFD_NUM_MB must be one of: 1 2; got '3'"),
    ({"AFD_NUM_MB": "2", "AFD_ATTN_WORKERS": "2"}, "refusing AFD_ATTN_WORKERS=2"),
    ({"AFD_NUM_MB": "1", "AFD_EXPERT_WORKERS": "8"}, "refusing AFD_EXPERT_WORKERS=8"),
    ({"AFD_NUM_MB": "2", "NSYS": "1"}, "NSYS=1 needs Nsight Systems"),
])
def test_throughput_refusals(preset: str, knobs: dict[str, str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AFD_", "NSYS", "QWEN35_"))}
    env |= knobs | {"QWEN35_DRY_RUN": "1"}
    if "NSYS" in knobs:
        env["PATH"] = _no_nsys_path()
    r = _run([str(THROUGHPUT[preset])], env)
    assert r.returncode != 0 and message in r.stderr, r.stderr


@pytest.fixture(scope="module")
def full_pool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pool of the shape both throughput presets demand (400 prompts of 8192 tokens); the dry
    run checks the shape, not the text."""
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    ids = json.dumps(list(range(8192)))
    path.write_text("".join(f'{{"id":{i},"prompt_token_ids":{ids}}}\n' for i in range(400)))
    return path


def _documented_dry_runs() -> dict[str, str]:
    """docs/qwen35_presets.md: a `<!-- dry-run: NAME -->` line, then the fenced output."""
    text = (ROOT / "docs/qwen35_presets.md").read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- dry-run: (\w+) -->\n```\n(.*?)```", text, re.DOTALL)}


def _derived_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.strip().splitlines() if not ln.startswith(LOCAL_LINES)]


@pytest.mark.parametrize("preset", sorted(THROUGHPUT))
def test_throughput_dry_run_matches_the_docs(preset: str, full_pool: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AFD_", "NSYS", "QWEN35_", "MODEL_PATH"))}
    env |= {"AFD_NUM_MB": "2", "QWEN35_DRY_RUN": "1", "PROMPT_FILE": str(full_pool), "AFD_TOTAL_NODES": "2"}
    r = _run([str(THROUGHPUT[preset])], env)
    assert r.returncode == 0, r.stderr
    assert "AFD_TOTAL_NODES=2 is ignored" in r.stderr
    out = r.stdout
    assert f"prompt pool              {full_pool}" in out
    for key in ("topology", "global batch", "decode graph buckets", "pages per request", "max batched tokens",
                "prefill steps", "decode steps", "profile window", "memory ratio", "pending steps", "dispatch dtype",
                "prompt pool sha256", "run dir"):
        assert re.search(rf"^{key} +\S", out, re.MULTILINE), f"no {key!r} in the dry run:\n{out}"
    assert _derived_lines(out) == _derived_lines(_documented_dry_runs()[preset]), out


STUB = """#!{python}
# Records each call; fakes servers (answers /health until stopped, a minute at most) and the pool
# generator.
import json, os, sys, threading
argv = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": argv, "env": dict(os.environ)}}) + "\\n")
if argv[:1] == ["-c"]:
    os.execv({python!r}, [{python!r}, *argv])
if "serve" in argv:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    threading.Timer(60, os._exit, (0,)).start()

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Health).serve_forever()
elif "--output" in argv:
    open(argv[argv.index("--output") + 1], "w").write("{{}}\\n")
"""


def _calls(script: Path, knobs: dict[str, str], base: dict[str, str], tmp: Path) -> list[dict]:
    log = tmp / "calls.jsonl"
    log.unlink(missing_ok=True)
    shutil.rmtree(tmp / "pools", ignore_errors=True)
    r = _run([str(script)], base | knobs | {"STUB_LOG": str(log)})
    assert r.returncode == 0, r.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    for c in calls:
        c["env"] = {k: v for k, v in c["env"].items() if k not in BASH_VARS}
    return calls


@pytest.mark.parametrize("preset", sorted(ALIGNMENT_PRESETS))
def test_alignment_preset_equals_the_direct_driver_call(preset: str, tmp_path: Path, tiny_checkpoints) -> None:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python").write_text(STUB.format(python=sys.executable))
    (stubs / "python").chmod(0o755)
    (stubs / "vllm").symlink_to(stubs / "python")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AFD_", "PROMPT", "REFERENCE", "CANDIDATE"))}
    base |= {"PATH": f"{stubs}:{os.environ['PATH']}", "MINISGL_PYTHON": str(stubs / "python"),
             "MODEL_PATH": tiny_checkpoints["bf16"], "RUN_DIR": str(tmp_path / "run"),
             "POOL_DIR": str(tmp_path / "pools")}
    base["CANDIDATE_PORT"], base["REFERENCE_PORT"] = _two_free_ports()  # fixed, so both runs name the same
    via_preset = _calls(ROOT / preset, {}, base, tmp_path)
    direct = _calls(DRIVER, ALIGNMENT_PRESETS[preset], base, tmp_path)
    assert via_preset == direct
    knobs = ALIGNMENT_PRESETS[preset]
    serve = next(c["argv"] for c in direct if c["argv"][:3] == ["-m", "minisgl", "serve"])
    if "AFD_ATTN_WORKERS" in knobs:
        assert serve[serve.index("--afd-attn-workers") + 1] == knobs["AFD_ATTN_WORKERS"]
    assert direct[-1]["argv"][:4] == ["-m", "minisgl.tools.align", "--stage",
                                      "sample" if knobs["REFERENCE"] == "none" else "score"]


def _two_free_ports() -> tuple[str, str]:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = tuple(str(s.getsockname()[1]) for s in socks)
    for s in socks:
        s.close()
    return ports


def test_prompt_pool_is_deterministic(tmp_path: Path, tiny_checkpoints) -> None:
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "a.md").write_text("".join(f"Line {i}: the quick brown fox jumps over the lazy dog {i * i}.\n"
                                      for i in range(40)))
    (src / "b" / "c.txt").write_text("Pack my box with five dozen liquor jugs. " * 30)
    (src / "skip.bin").write_text("not text")
    out = tmp_path / "pool.jsonl"
    r = _run([sys.executable, str(ROOT / "scripts/data_gen/generate_prompts.py"), "--tokenizer",
              tiny_checkpoints["bf16"], "--source-dir", str(src), "--num-prompts", "6", "--prompt-len", "48",
              "--seed", "3", "--output", str(out)], dict(os.environ))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(row["prompt_token_ids"]) for row in rows] == [48] * 6
    assert r.stdout.split()[:3] == [str(out), "sha256", TEST_POOL_SHA256]
