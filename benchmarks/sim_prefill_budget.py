"""The scheduler's prefill budget beside decodes, replayed on the CPU against a step-cost model.

    python benchmarks/sim_prefill_budget.py [--profiles NAMES] [--chunks 1024,4096,16384]

Each profile sends its prompts as the bench client does (the first `concurrency` at once, then one
more each time a request finishes; fixed prompt and output lengths, as `serve_matrix.py`'s rows)
into the real `scheduler.rules.plan_batch`, and advances a clock by a linear step cost:
a_ms + b_us x prompt tokens + d_us x decoding requests. It prints, for the budget rule in use
(prefill_budget.step_prefill_budget) and for the rules it replaced, each profile's duration and
the ITL median and P99 (each request's gaps between output tokens), so a rule can be chosen
before it takes device time. The costs are fitted to measured steps (docs/benchmarks.md,
eleventh session), the Long Context profile's to its latest served run (twenty-third session: 66.6 s
and an ITL median of 85.8 ms, replayed as 66.6 s and 85.7 ms; 17.2 us a prompt token, what the step
it is served in costs alone, 16.4-17.1 us on an H100 in the twenty-fourth session). The pool is not modelled
(every request is admitted when the budget reaches it), nor prefix caching, nor sampling.
"""
from __future__ import annotations

import argparse
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

from gpu_timing import table
from minisgl.kvcache.allocator import Admission
from minisgl.prefill_budget import step_prefill_budget
from minisgl.sampling_params import SamplingParams
from minisgl.scheduler import rules
from minisgl.scheduler.request import Request

CHUNK, PER_REQUEST, MAX_PREFILL = 1024, 16, 16384  # the server's defaults


@dataclass(frozen=True)
class Profile:
    requests: int
    concurrency: int
    prompt: int
    output: int
    a_ms: float  # a step's fixed cost: weights read, launches, a decode step's floor
    b_us: float  # per prompt token
    d_us: float  # per decoding request (its KV and state)


# 122B: a 16K-token step at ~33 us a token (bench_prefill.py), 32 decodes at 8K in ~32 ms.
# 35B: 16 x 1024 at ~16 us a token, ~17 us after a 16K prefix; 200 decodes in ~24 ms.
PROFILES = {
    "122B 8K/256 c=32": Profile(64, 32, 8192, 256, 30.0, 33.0, 60.0),
    "122B 8K/256 c=64": Profile(128, 64, 8192, 256, 30.0, 33.0, 60.0),
    "35B Throughput 1024/128 x1000 c=512": Profile(1000, 512, 1024, 128, 12.0, 16.0, 60.0),
    "35B Generation Heavy 1000/2000 x200": Profile(200, 200, 1000, 2000, 12.0, 16.0, 60.0),
    "35B Long Context 32000/100 x100": Profile(100, 100, 32000, 100, 12.0, 17.2, 150.0),
}

Rule = Callable[[int, int, int, int, int, int], int]


def _former_per_decode(decodes: int, prefilling: int, requests: int, chunk: int, per_request: int,
                       max_prefill_tokens: int) -> int:
    """Until the eleventh session: a chunk for each prompt per decoding request."""
    if decodes == 0:
        return max_prefill_tokens
    return min(max_prefill_tokens, max(chunk, per_request * requests, chunk * prefilling // decodes))


def _surplus_over_decodes(decodes: int, prefilling: int, requests: int, chunk: int, per_request: int,
                          max_prefill_tokens: int) -> int:
    """Measured on the GPU in the eleventh session: the ramp from 1x the decodes instead of 1.5x."""
    if decodes == 0:
        return max_prefill_tokens
    surplus = prefilling - decodes
    ramp = chunk + (max_prefill_tokens - chunk) * surplus // prefilling if surplus > 0 else chunk
    return min(max_prefill_tokens, max(chunk, per_request * requests, ramp))


RULES: dict[str, Rule] = {
    "in use (ramp from 1.5x the decodes)": step_prefill_budget,
    "ramp from 1x the decodes": _surplus_over_decodes,
    "a chunk per prompt per decode (former)": _former_per_decode,
}


class _Pool:
    """Admits every request: the budget alone decides who prefills."""

    def can_allocate(self, reserve_tokens: int) -> bool:
        return True

    def admit(self, prompt: list[int], reserve_tokens: int, reuse: bool, chat_turn: bool = False) -> Admission:
        return Admission(0)  # no prefix cache: the profiles' prompts share nothing

    def awaits_prefix(self, prompt: list[int]) -> bool:
        return False


def replay(profile: Profile, rule: Rule, chunk: int = CHUNK) -> dict[str, float]:
    """The profile served under `rule` with --chunked-prefill-size `chunk`: duration and ITL figures,
    in seconds and milliseconds."""
    params = SamplingParams(temperature=0, max_tokens=profile.output, ignore_eos=True)
    prompts = deque(Request(f"r{i}", [1] * profile.prompt, params) for i in range(profile.requests))
    running: list[Request] = []
    waiting: deque[Request] = deque()
    last_token: dict[str, float] = {}
    gaps: list[float] = []
    clock, finished = 0.0, 0
    max_len = profile.prompt + profile.output + 1
    with mock.patch.object(rules, "step_prefill_budget", rule):
        while finished < profile.requests:
            while prompts and len(running) + len(waiting) < profile.concurrency:
                waiting.append(prompts.popleft())
            items = rules.plan_batch(running, waiting, _Pool(), max_len, chunk, MAX_PREFILL, PER_REQUEST)
            decodes = [r for r, _ in items if r.prefill_done]
            prompt_tokens = sum(n for r, n in items if not r.prefill_done)
            clock += (profile.a_ms + profile.b_us * prompt_tokens / 1e3 + profile.d_us * len(decodes) / 1e3) / 1e3
            for r, n in items:
                r.num_computed += n
                if r.prefill_done:  # a decode fed its newest token, or the prompt's last chunk: one more token
                    r.output_ids.append(1)
                    if r.rid in last_token:
                        gaps.append(clock - last_token[r.rid])
                    last_token[r.rid] = clock
            for r in [r for r in running if len(r.output_ids) >= profile.output]:
                running.remove(r)
                finished += 1
    gaps.sort()
    median, p99 = statistics.median(gaps) * 1e3, gaps[int(0.99 * (len(gaps) - 1))] * 1e3
    return {"duration s": clock, "ITL median ms": median, "ITL P99 ms": p99, "P99 / median": p99 / median}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated names of PROFILES")
    ap.add_argument("--chunks", default="",
                    help="comma-separated --chunked-prefill-size values to replay under the rule in use "
                         "(the trade of a larger chunk: shorter runs, longer waits between tokens)")
    args = ap.parse_args()
    rows = []
    for name in args.profiles.split(","):
        for rule_name, rule in RULES.items():
            rows.append({"profile": name, "rule": rule_name, **replay(PROFILES[name], rule)})
            print(rows[-1], flush=True)
        for chunk in (int(c) for c in args.chunks.split(",") if c):
            rows.append({"profile": name, "rule": f"in use, --chunked-prefill-size {chunk}",
                         **replay(PROFILES[name], step_prefill_budget, chunk)})
            print(rows[-1], flush=True)
    print(table(rows, "Prefill budget rules replayed against the step-cost model (CPU)"))


if __name__ == "__main__":
    main()
