"""python -m minisgl.bench serve|offline (flags as sglang.bench_serving / bench_offline_throughput)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

from minisgl.bench.dataset import random_requests


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", choices=["random"], default="random")
    p.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=128)
    p.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=32)
    p.add_argument("--random-range-ratio", type=float, default=1.0, help="lengths in [ratio * len, len]")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--disable-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--output-json", help="also write the figures here")


def _write(path: str | None, figures: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)
            f.write("\n")


def _serve(ns: argparse.Namespace) -> None:
    from minisgl.bench import serve
    from minisgl.bench.report import format_block, summarize
    from minisgl.tokenizer.tokenizer import load_tokenizer

    base = ns.base_url.rstrip("/")
    model, root = serve.served_model(base)
    tokenizer_path = ns.tokenizer or root
    if tokenizer_path is None:
        raise ValueError("the server does not say where its model is; pass --tokenizer")
    tokenizer = load_tokenizer(tokenizer_path)
    reqs = random_requests(tokenizer, ns.num_prompts, ns.input_len, ns.output_len, ns.random_range_ratio, ns.seed)
    cfg = serve.ServeConfig(base, ns.model or model, ns.request_rate, ns.max_concurrency, not ns.disable_ignore_eos,
                            ns.seed)
    results, duration = asyncio.run(serve.run(cfg, reqs, progress=not ns.disable_tqdm))
    figures = summarize(results, duration, ns.request_rate, ns.max_concurrency)
    print(format_block(figures, ns.backend))
    failed = [r.error for r in results if not r.ok]
    if failed:
        print(f"{len(failed)} requests failed; first error: {failed[0]}", file=sys.stderr)
    _write(ns.output_json, figures)


def _offline(ns: argparse.Namespace) -> None:
    from minisgl.bench import offline
    from minisgl.llm import LLM
    from minisgl.server.cli_args import engine_args_from

    llm = LLM(**dataclasses.asdict(engine_args_from(ns)))
    reqs = random_requests(llm.tokenizer, ns.num_prompts, ns.input_len, ns.output_len, ns.random_range_ratio, ns.seed)
    figures = offline.run(llm, reqs, not ns.disable_ignore_eos)
    print(offline.format_block(figures))
    _write(ns.output_json, figures)


def main(argv: list[str] | None = None) -> None:
    from minisgl.server.cli_args import add_engine_args

    parser = argparse.ArgumentParser(prog="python -m minisgl.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="benchmark a running OpenAI-compatible server")
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", default="minisgl", help="a label for the result block")
    p.add_argument("--model", help="default: the server's only model")
    p.add_argument("--tokenizer", help="for the random prompts; default: the server's model path")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--seed", type=int, default=1, help="for the prompts and the arrival times")
    _common(p)
    p.set_defaults(func=_serve)
    p = sub.add_parser("offline", help="throughput of the offline LLM API")
    _common(p)
    add_engine_args(p)  # its --seed also seeds the prompts
    p.set_defaults(func=_offline)
    ns = parser.parse_args(argv)
    try:
        ns.func(ns)
    except ValueError as e:
        parser.exit(2, f"minisgl.bench {ns.command}: error: {e}\n")


if __name__ == "__main__":
    main()
