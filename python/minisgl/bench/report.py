"""The serving result block, in the layout and order of sglang.bench_serving, and its JSON form.
Percentiles are numpy.percentile's (linear interpolation), std the population standard deviation."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    input_len: int
    output_len: int
    latency: float  # seconds, send to last byte
    ttft: float  # seconds to the first token
    itl: tuple[float, ...]  # seconds between consecutive token chunks
    error: str = ""
    cached_len: int = 0  # prompt tokens the server's prefix cache served (its usage's cached_tokens)
    output_ids: tuple[int, ...] = ()  # the output's token ids, where asked for (agent conversations)
    output_text: str = ""  # the answer's content (chat conversations send it back)


STATS = ("mean", "median", "std", "p90", "p95", "p99")
_STAT_LABELS = {"mean": "Mean", "median": "Median", "std": "Std", "p90": "P90", "p95": "P95", "p99": "P99"}


def _ms(xs: list[float]) -> dict[str, float]:
    """Each of STATS in ms (0s when empty)."""
    if not xs:
        return dict.fromkeys(STATS, 0.0)
    a = np.asarray(xs, dtype=np.float64) * 1e3
    return {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
            **{f"p{q}": float(np.percentile(a, q)) for q in (90, 95, 99)}}


def throughput(completed: int, input_tokens: int, output_tokens: int, duration: float) -> dict:
    return {
        "completed": completed,
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": completed / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "total_throughput": (input_tokens + output_tokens) / duration,
    }


def summarize(results: list[RequestResult], duration: float, request_rate: float, max_concurrency: int | None) -> dict:
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itl = [x for r in ok for x in r.itl]
    out = {
        "request_rate": request_rate,
        "max_concurrency": max_concurrency,
        "failed": len(results) - len(ok),
        **throughput(len(ok), sum(r.input_len for r in ok), sum(r.output_len for r in ok), duration),
        "concurrency": sum(r.latency for r in ok) / duration,
        "total_cached_tokens": sum(r.cached_len for r in ok),
    }
    for name, xs in (("e2e_latency", [r.latency for r in ok]), ("ttft", [r.ttft for r in ok]), ("tpot", tpot),
                     ("itl", itl)):
        out.update({f"{stat}_{name}_ms": value for stat, value in _ms(xs).items()})
    out["max_itl_ms"] = max(itl) * 1e3 if itl else 0.0
    return out


def turn_ttfts(talks: list[list[RequestResult]]) -> list[tuple[float, float]]:
    """(mean, median) TTFT in ms of each turn over the conversations that got that far."""
    out = []
    for turn in range(max(len(t) for t in talks)):
        ttfts = [t[turn].ttft * 1e3 for t in talks if len(t) > turn and t[turn].ok]
        out.append((float(np.mean(ttfts)), float(np.median(ttfts))) if ttfts else (0.0, 0.0))
    return out


_WIDTH = 50


def render(title: str, rows: list[tuple[str, object] | str]) -> str:
    """A result block: (label, value) rows, and section titles given as plain strings."""
    lines = [f" {title} ".center(_WIDTH, "=")]
    for row in rows:
        if isinstance(row, str):
            lines.append(f"{row}".center(_WIDTH, "-"))
        else:
            label, value = row
            lines.append(f"{label:<40} {value:.2f}" if isinstance(value, float) else f"{label:<40} {value}")
    lines.append("=" * _WIDTH)
    return "\n".join(lines)


def throughput_rows(s: dict) -> list[tuple[str, object] | str]:
    return [
        ("Successful requests:", s["completed"]),
        ("Benchmark duration (s):", s["duration"]),
        ("Total input tokens:", s["total_input_tokens"]),
        ("Total generated tokens:", s["total_output_tokens"]),
        ("Request throughput (req/s):", s["request_throughput"]),
        ("Input token throughput (tok/s):", s["input_throughput"]),
        ("Output token throughput (tok/s):", s["output_throughput"]),
        ("Total token throughput (tok/s):", s["total_throughput"]),
    ]


def format_block(s: dict, backend: str) -> str:
    rows: list[tuple[str, object] | str] = [
        ("Backend:", backend),
        ("Traffic request rate:", s["request_rate"]),
        ("Max request concurrency:", s["max_concurrency"] or "not set"),
        *throughput_rows(s)[:1],
        ("Failed requests:", s["failed"]),
        *throughput_rows(s)[1:],
        ("Concurrency:", s["concurrency"]),
    ]
    for title, key, label in (("End-to-End Latency", "e2e_latency", "E2E Latency"),
                              ("Time to First Token", "ttft", "TTFT"),
                              ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
                              ("Inter-Token Latency", "itl", "ITL")):
        rows.append(title)
        rows += [(f"{_STAT_LABELS[stat]} {label} (ms):", s[f"{stat}_{key}_ms"]) for stat in STATS]
    rows.append(("Max ITL (ms):", s["max_itl_ms"]))
    return render("Serving Benchmark Result", rows)
