"""The command line: every flag described (help and choices from the dataclass fields), dtype
aliases, --version, and start-up mistakes reported as one line with a hint before anything loads."""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from minisgl import __version__
from minisgl.__main__ import build_parser, main
from minisgl.arg_field import arg
from minisgl.bench.__main__ import build_parser as build_bench_parser
from minisgl.engine.args import EngineArgs
from minisgl.server.cli_args import engine_args_from
from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.models.tiny.default import default_model_path

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("restore_logging")  # main() sets up logging on captured stderr


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every parser a user reaches: minisgl's subcommands and bench's."""
    out = {}
    for name, parser in (("minisgl", build_parser()), ("minisgl bench", build_bench_parser())):
        out[name] = parser
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        out.update({f"{name} {cmd}": p for cmd, p in sub.choices.items()})
    return out


def test_every_flag_has_a_description() -> None:
    commands = _commands()
    assert {"minisgl serve", "minisgl generate", "minisgl make-tiny-model", "minisgl bench serve",
            "minisgl bench offline"} <= set(commands)
    for name, parser in commands.items():
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            text = (action.help or "") % {"default": action.default}
            flag = action.option_strings[-1]
            # A description says what the flag does: more than its default, several words.
            assert len(text.split()) >= 3 and not text.startswith("default"), f"{name} {flag}: {text!r}"


def test_help_comes_from_the_fields() -> None:
    help_text = build_parser()._actions[-1].choices["serve"].format_help()
    for needle in ("--afd-dispatch-dtype {bf16,fp8}", "--afd-mb-split {count,context}", "M attention workers",
                   "--log-level {critical,error,warning,info,debug}", "--gpu-memory-utilization",
                   "--decode-log-interval", "--log-requests", "--log-level-http"):
        assert needle in " ".join(help_text.split()), needle
    assert "bench" in build_parser().format_help()
    with pytest.raises(ValueError, match="description"):
        arg(1, "  ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"minisgl {__version__}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "minisgl.version.__version__"}


@pytest.mark.parametrize("alias, name", [("half", "float16"), ("fp16", "float16"), ("bf16", "bfloat16"),
                                         ("float", "float32"), ("fp32", "float32"), ("bfloat16", "bfloat16")])
def test_dtype_aliases(alias: str, name: str) -> None:
    parser = build_parser()
    ns = parser.parse_args(["serve", "--dtype", alias, "--mamba-ssm-dtype", "bf16"])
    args = engine_args_from(ns)
    assert args.dtype == name and args.mamba_ssm_dtype == "bfloat16"
    assert EngineArgs(dtype=alias).dtype == name


@pytest.mark.parametrize("flags, on", [([], True), (["--enable-prefix-caching"], True),
                                       (["--no-enable-prefix-caching"], False), (["--disable-radix-cache"], False)])
def test_prefix_cache_flags_as_vllm_and_sglang(flags: list[str], on: bool) -> None:
    assert engine_args_from(build_parser().parse_args(["serve", *flags])).enable_prefix_caching is on


def test_unknown_dtype_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--dtype", "fp64"])
    err = capsys.readouterr().err
    assert "--dtype" in err and "half" in err and "bfloat16" in err
    with pytest.raises(ValueError, match="mamba_ssm_dtype"):
        EngineArgs(mamba_ssm_dtype="half")


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    start = time.monotonic()
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert time.monotonic() - start < 10  # found before anything loads
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "Loading weights" not in err, err
    return lines[0]


def _checkpoint_without(tmp_path: Path, *missing: str) -> str:
    """A copy of the tiny checkpoint less the files whose names end with any of `missing`."""
    dst = tmp_path / "ckpt"
    shutil.copytree(default_model_path(), dst, ignore=lambda d, names: [n for n in names if n.endswith(missing)])
    return str(dst)


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_model_path_mistakes(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--prompt", "x"] if command == "generate" else []
    cases = {
        "Qwen/Qwen3.5-122B-A10B": "huggingface-cli download Qwen/Qwen3.5-122B-A10B",
        str(tmp_path / "missing"): "does not exist",
        str(tmp_path): "no config.json",
        _checkpoint_without(tmp_path, "tokenizer.json", "tokenizer.model", "vocab.json"): "holds no tokenizer",
        default_model_path() + "/config.json": "is a file",
    }
    for path, says in cases.items():
        line = _one_line_error(capsys, [command, "--model-path", path, *extra])
        assert line.startswith(f"minisgl {command}: error:") and says in line and "hint:" in line, line


def test_checkpoint_without_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _checkpoint_without(tmp_path, ".safetensors")
    line = _one_line_error(capsys, ["serve", "--model-path", path, "--port", "1"])
    assert "no *.safetensors" in line and "--load-format dummy" in line


def test_tokenizer_missing_is_an_error(tmp_path: Path) -> None:
    path = _checkpoint_without(tmp_path, "tokenizer.json", "tokenizer.model", "vocab.json")
    with pytest.raises(ValueError, match="holds no tokenizer"):
        load_tokenizer(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for a torch without CUDA")
def test_cuda_without_cuda_torch(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line_error(capsys, ["serve", "--device", "cuda"])
    assert "sees no CUDA GPU" in line and "--device cpu" in line


def test_busy_port_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = _one_line_error(capsys, ["serve", "--port", str(port), "--device", "cpu"])
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line


def test_real_cli_prints_one_line() -> None:
    """Through the installed entry point's module, as a user types it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "minisgl", "serve", "--model-path", "/no/such/model"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "minisgl serve: error: model path '/no/such/model' does not exist (hint: pass the checkpoint folder that "
        "holds config.json, or leave it out for the embedded tiny model)"]
