"""What every process sets up alike: one weight-loading bar per role (only the process that
set_loading_bar names draws one, on its own line), and the log level inherited through the
environment."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from minisgl import process_setup


@pytest.fixture(autouse=True)
def _restore(restore_logging: None) -> Iterator[None]:
    yield
    process_setup.set_loading_bar("Loading weights")


def test_only_the_role_lead_draws_a_bar() -> None:
    process_setup.set_loading_bar("Loading weights (experts)", line=1)
    bar = process_setup.loading_bar(10, "tensor")
    assert not bar.disable and bar.desc == "Loading weights (experts)" and bar.pos in (1, -1)
    bar.close()
    process_setup.set_loading_bar(None)
    silent = process_setup.loading_bar(10, "tensor")
    assert silent.disable
    silent.close()


def test_log_level_travels_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    process_setup.set_log_level("warning")
    assert os.environ[process_setup.LOG_LEVEL_ENV] == "warning"  # what child processes read
    process_setup.setup_logging("t")
    assert logging.getLogger().level == logging.WARNING
    monkeypatch.setenv(process_setup.LOG_LEVEL_ENV, "debug")
    process_setup.setup_logging("t")
    assert logging.getLogger().level == logging.DEBUG
