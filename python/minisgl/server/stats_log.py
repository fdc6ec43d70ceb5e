"""The engine's periodic stats line, in the "Decode batch." format of SGLang's log (which its tuning
guide and people's log scrapers read), every --decode-log-interval decode steps:

    Decode batch. #running-req: 8, #token: 1024, token usage: 0.12, gen throughput (token/s): 512.30,
    input throughput (token/s): 2048.00, #queue-req: 0, #compiles: 31

#token counts the KV tokens the pages in use hold, token usage their share of the pool; the two
throughputs count output tokens and prompt tokens whose prefill finished since the previous line,
over the wall time between the lines; #compiles is the Triton compile count since start (a rise
after ready is a stall)."""
from __future__ import annotations

import time
from collections.abc import Callable

from minisgl.scheduler.messages import RequestOutput, SchedulerStats


class StatsLine:
    def __init__(self, interval: int, page_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval  # decode steps between lines; 0 = never
        self.page_size = page_size
        self.clock = clock
        self._prompt_lens: dict[str, int] = {}  # requests whose prefill has not finished
        self._decode_steps = self._generated = self._prefilled = 0
        self._since = clock()

    def on_request(self, rid: str, prompt_len: int) -> None:
        self._prompt_lens[rid] = prompt_len

    def on_step(self, outputs: list[RequestOutput]) -> None:
        generated = 0
        for o in outputs:
            # The first output with tokens (or prompt logprobs) says the prompt went through.
            if o.new_token_ids or o.prompt_logprobs is not None:
                self._prefilled += self._prompt_lens.pop(o.rid, 0)
            elif o.finished:
                self._prompt_lens.pop(o.rid, None)  # aborted before its prefill ended
            generated += len(o.new_token_ids)
        self._generated += generated
        self._decode_steps += generated > 0

    @property
    def due(self) -> bool:
        return self.interval > 0 and self._decode_steps >= self.interval

    def line(self, s: SchedulerStats) -> str:
        """The line for the steps since the previous one; starts the next interval."""
        now = self.clock()
        seconds = max(now - self._since, 1e-9)
        text = (f"Decode batch. #running-req: {s.num_running}, #token: {s.used_pages * self.page_size}, "
                f"token usage: {s.used_pages / max(s.total_pages, 1):.2f}, "
                f"gen throughput (token/s): {self._generated / seconds:.2f}, "
                f"input throughput (token/s): {self._prefilled / seconds:.2f}, "
                f"#queue-req: {s.num_waiting}, #compiles: {s.compiles}")
        self._decode_steps = self._generated = self._prefilled = 0
        self._since = now
        return text
