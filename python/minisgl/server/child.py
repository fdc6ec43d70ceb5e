"""What every child process of the server (engine, detokenizer) does the same way."""
from __future__ import annotations

import logging
import os
import signal
import sys


def setup_child(log_level: str) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(processName)s %(name)s: %(message)s", stream=sys.stderr
    )
    # Ctrl-C reaches the whole process group; the API server shuts the children down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM (the API server stopping us) unwinds normally, so cleanup (e.g. AFD workers) runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def parent_alive(parent_pid: int) -> bool:
    """False once the API server is gone (we were re-parented), so a child never outlives it."""
    return os.getppid() == parent_pid
