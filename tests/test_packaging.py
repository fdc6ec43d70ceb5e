"""Installing: pyproject.toml declares every third-party import, the wheel carries a readme and a
license, and `make` installs CUDA torch and the [gpu] extra only where nvidia-smi lists a GPU."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Distributions whose module name differs, for optional packages a CPU machine may not have
# installed to ask (triton, matplotlib and the like are asked by their module's name).
MODULE_OWNERS = {"fla": "flash-linear-attention"}
# Optional modules that no pip requirement can provide, each with the script that installs it
# (PyPI's deep-gemm is an incomplete sdist: the script takes DeepGEMM out of vLLM's wheel).
SCRIPT_INSTALLED = {"deep_gemm": "scripts/quickstart/install_deep_gemm.sh"}


def _imported_modules() -> set[str]:
    mods: set[str] = set()
    for path in (ROOT / "python" / "minisgl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return mods - set(sys.stdlib_module_names) - {"minisgl", "__future__"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_import_is_declared() -> None:
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= {_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    owners = importlib.metadata.packages_distributions()
    missing = {}
    for mod in _imported_modules() - set(SCRIPT_INSTALLED):
        dists = owners.get(mod) or [MODULE_OWNERS.get(mod, mod)]
        if not any(_name(d) in declared for d in dists):
            missing[mod] = dists
    assert not missing, f"imported but not in pyproject.toml: {missing}"


@pytest.mark.parametrize("module,script", sorted(SCRIPT_INSTALLED.items()))
def test_script_installed_modules_have_their_script(module: str, script: str) -> None:
    assert module in _imported_modules(), f"{module} is no longer imported: drop it from SCRIPT_INSTALLED"
    assert f"as `{module}`" in (ROOT / script).read_text(), f"{script} does not install {module}"


def test_wheel_metadata() -> None:
    assert PROJECT["readme"] == "README.md" and (ROOT / "README.md").is_file()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def _make_dry_run(tmp_path: Path, gpus: int) -> str:
    """`make -n demo test` (print, do not run) with a stand-in nvidia-smi listing `gpus` GPUs."""
    bin_dir = tmp_path / f"bin{gpus}"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i})"\n' for i in range(gpus)))
    smi.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}" if gpus else "/usr/bin:/bin"  # /usr/bin has no nvidia-smi here
    r = subprocess.run(["make", "-n", "-B", "demo", "test", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PATH": path}, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.skipif(shutil.which("nvidia-smi", path="/usr/bin:/bin") is not None, reason="a real GPU machine")
def test_make_installs_cuda_only_on_gpu_machines(tmp_path: Path) -> None:
    cpu = _make_dry_run(tmp_path, 0)
    assert "pip install -q torch==2.13.0" in cpu and "download.pytorch.org" not in cpu
    assert '".[test]"' in cpu and "gpu]" not in cpu and "--system-site-packages" not in cpu
    assert cpu.count("--device cpu") == 2
    one = _make_dry_run(tmp_path, 1)
    assert "--index-url https://download.pytorch.org/whl/cu" in one and '".[test,gpu]"' in one
    assert "--system-site-packages" in one
    assert "--ignore-eos \\\n\t--device cuda" in one and "--check-colocated --device cpu" in one  # AFD 2+2 needs 4
    four = _make_dry_run(tmp_path, 4)
    assert "--check-colocated --device cuda" in four
