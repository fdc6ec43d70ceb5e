"""What every child process of the server (engine, detokenizer) does the same way."""
from __future__ import annotations

import os
import signal
import sys

from minisgl.process_setup import name_process, setup_logging


def setup_child(name: str) -> None:
    """`name`: what ps shows (minisgl-NAME) and what its log lines say."""
    name_process(f"minisgl-{name}")
    setup_logging(name)
    # Ctrl-C reaches the whole process group; the API server shuts the children down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM (the API server stopping us) unwinds normally, so cleanup (e.g. AFD workers) runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def parent_alive(parent_pid: int) -> bool:
    """False once the API server is gone (we were re-parented), so a child never outlives it."""
    return os.getppid() == parent_pid
