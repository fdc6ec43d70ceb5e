"""Shared fixtures: tiny checkpoints built once per session, and the `gpu` mark's skip on CPU."""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# Tiny models are dispatch-bound: one thread avoids OpenMP spin contention on small CI machines
# (measured 15x faster than two threads on a loaded 2-core box).
torch.set_num_threads(1)

pytest_plugins = ("server_harness",)  # the session's shared live server (tests/server_harness.py)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For tests that run a command's main(): it sets the root logger up (on the test's captured
    stderr) and MINISGL_LOG_LEVEL; both go back afterwards."""
    from minisgl.process_setup import LOG_LEVEL_ENV

    monkeypatch.setenv(LOG_LEVEL_ENV, os.environ.get(LOG_LEVEL_ENV, "info"))  # the undo restores it
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # The embedded default model is built into this session's temp dir, never the user's cache.
    os.environ["MINISGL_CACHE"] = str(tmp_path_factory.mktemp("minisgl-cache"))


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from minisgl.models.tiny.make import make_tiny_model
    from minisgl.models.tiny.default import trained_model_path

    root = tmp_path_factory.mktemp("ckpt")
    return {
        "bf16": make_tiny_model(str(root / "bf16"), arch="qwen3_5_moe", fp8=False, seed=1),
        "fp8": make_tiny_model(str(root / "fp8"), arch="qwen3_5_moe", fp8=True, seed=2),
        "qwen3_moe": make_tiny_model(str(root / "qwen3_moe"), arch="qwen3_moe", fp8=False, seed=3),
        "trained": trained_model_path(fp8=False),  # the embedded default
        "trained_fp8": trained_model_path(fp8=True),
    }
