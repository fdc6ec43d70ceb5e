"""What every minisgl process sets up the same way: the name `ps -e`, `top` and `pgrep` show, its
log level and format, and whether it draws the weight-loading bar.

The log level travels in the environment (MINISGL_LOG_LEVEL, set by the command line), so every
process started below the command inherits it: the server's engine and detokenizer, the TP ranks,
and the AFD workers the engine starts in turn.

Only one process of each role draws a loading bar (the engine, the first attention worker, the
first expert worker), each on its own line, so parallel loads never interleave into garbage.
"""
from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm

LOG_LEVEL_ENV = "MINISGL_LOG_LEVEL"
DEFAULT_LOG_LEVEL = "info"
_COMM_MAX = 15  # the kernel keeps 15 characters of a process name

_bar: tuple[str, int] | None = ("Loading weights", 0)  # (label, line) of this process's bar; None: no bar


def name_process(name: str) -> None:
    """The name ps and top show (Linux), so an operator can tell the processes apart (and kill one)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:_COMM_MAX])
    except OSError:
        pass  # not Linux: the name is only a convenience


def set_log_level(level: str) -> None:
    """This process's level, and that of every process it starts from now on."""
    os.environ[LOG_LEVEL_ENV] = level
    logging.getLogger().setLevel(level.upper())


def setup_logging(tag: str) -> None:
    """Log to stderr at the inherited level, each line naming the process (`tag`)."""
    level = os.environ.get(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL).upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {tag} %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)


def set_loading_bar(label: str | None, line: int = 0) -> None:
    """This process's weight-loading bar: its label and terminal line, or None for no bar."""
    global _bar
    _bar = None if label is None else (label, line)


def loading_bar(total: int, unit: str) -> tqdm:
    """A progress bar, drawn only when this process is its role's lead (set_loading_bar)."""
    label, line = _bar or ("", 0)
    return tqdm(total=total, desc=label, unit=unit, disable=_bar is None, position=line)
