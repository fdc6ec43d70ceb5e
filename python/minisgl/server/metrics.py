"""Prometheus metrics (GET /metrics), named like SGLang's with a `minisgl:` prefix."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from minisgl.scheduler.messages import RequestOutput, SchedulerStats

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"minisgl:{name}", doc, list(labels), registry=self.registry).labels(**labels)

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(
                f"minisgl:{name}", doc, list(labels), buckets=_LATENCY_BUCKETS, registry=self.registry
            ).labels(**labels)

        self.running = gauge("num_running_reqs", "Requests running in the engine")
        self.waiting = gauge("num_queue_reqs", "Requests waiting for pages or a state slot")
        self.page_usage = gauge("token_usage", "Fraction of KV pages in use")
        self.slot_usage = gauge("state_slot_usage", "Fraction of request (state) slots in use")
        self.prompt_tokens = Counter(
            "minisgl:prompt_tokens", "Prompt tokens processed", list(labels), registry=self.registry
        ).labels(**labels)
        self.cached_prompt_tokens = Counter(
            "minisgl:cached_prompt_tokens", "Prompt tokens served from the prefix cache", list(labels),
            registry=self.registry,
        ).labels(**labels)
        self.generation_tokens = Counter(
            "minisgl:generation_tokens", "Tokens generated", list(labels), registry=self.registry
        ).labels(**labels)
        self.requests = Counter(
            "minisgl:num_requests", "Finished requests", [*labels, "finish_reason"], registry=self.registry
        )
        self.model_name = model_name
        self.ttft = hist("time_to_first_token_seconds", "Time to first token")
        self.itl = hist("inter_token_latency_seconds", "Time between output tokens")
        self.e2e = hist("e2e_request_latency_seconds", "Request latency, arrival to finish")

    def on_engine_dead(self) -> None:
        """Nothing runs or waits once the engine is gone (its last stats would say otherwise)."""
        for g in (self.running, self.waiting, self.page_usage, self.slot_usage):
            g.set(0)

    def count_aborts(self, n: int) -> None:
        """n choices aborted because their client left (they never report a finish of their own)."""
        if n:
            self.requests.labels(model_name=self.model_name, finish_reason="abort").inc(n)

    def on_stats(self, s: SchedulerStats) -> None:
        self.running.set(s.num_running)
        self.waiting.set(s.num_waiting)
        self.page_usage.set(s.used_pages / max(s.total_pages, 1))
        self.slot_usage.set(s.used_slots / max(s.total_slots, 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Latency and token accounting for the choices of one HTTP request."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = time.perf_counter()
        self._last: dict[str, float] = {}  # rid -> time of its latest tokens

    def on_output(self, o: RequestOutput) -> None:
        now = time.perf_counter()
        m = self.metrics
        if o.new_token_ids:
            last = self._last.get(o.rid)
            if last is None:
                m.ttft.observe(now - self.start)
            else:
                for _ in o.new_token_ids:  # tokens that arrive together share the gap
                    m.itl.observe((now - last) / len(o.new_token_ids))
            self._last[o.rid] = now
        if o.finished:
            m.prompt_tokens.inc(o.num_prompt_tokens)
            m.cached_prompt_tokens.inc(o.num_cached_tokens)
            m.generation_tokens.inc(o.num_output_tokens)
            m.requests.labels(model_name=m.model_name, finish_reason=o.finish_reason).inc()
            m.e2e.observe(now - self.start)
