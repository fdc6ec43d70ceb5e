"""The API process's garbage collector while serving. Its start-up leaves a large heap (the
tokenizer, pydantic's schemas, torch's modules: ~250K tracked objects) that every full collection
would traverse again, and each request adds young objects that survive a while (a prompt's ids),
so with the default thresholds the collector cost the event loop ~1.6 s over 1,000 streamed
requests at 512 concurrent (gc callbacks, bench_host_path.py). Freezing the start-up heap takes it
out of every collection; a larger young generation lets most per-request objects die before a
collection ever sees them."""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # allocations between young collections (Python's default: 700)


def settle_for_serving() -> None:
    """Call once, when start-up is done: what exists now is never collected (nor traversed) again."""
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
