"""python -m minisgl.bench serve|offline (flags as sglang.bench_serving / bench_offline_throughput)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

import httpx
from transformers import PreTrainedTokenizerBase

from minisgl.bench.dataset import DATASETS, BenchRequest, random_requests, shared_prefix_requests, sharegpt_requests


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset-name", "--dataset", dest="dataset_name", choices=DATASETS, default="random",
                   help="random: random token ids of --input-len / --output-len; sharegpt: the conversations of "
                        "--dataset-path; generated-shared-prefix: groups of prompts sharing a system prompt, "
                        "sized by the --gsp-* flags (default: %(default)s)")
    p.add_argument("--dataset-path", help="sharegpt: a ShareGPT-format JSON file (a list of {\"conversations\": "
                                          "[{\"from\", \"value\"}, ...]})")
    p.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=128,
                   help="random: prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=32,
                   help="random: output tokens (default: %(default)s)")
    p.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="random: lengths drawn from [ratio * len, len] (default: %(default)s)")
    p.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="sharegpt: output tokens of every request (default: the length of each conversation's "
                        "answer)")
    p.add_argument("--sharegpt-context-len", type=int, default=None,
                   help="sharegpt: skip conversations longer than this, prompt + output (default: prompts over "
                        "1024 or totals over 2048 tokens)")
    for flag, default, what in (("num-groups", 64, "groups of prompts"), ("prompts-per-group", 16, "prompts a group"),
                                ("system-prompt-len", 2048, "tokens of a group's shared system prompt"),
                                ("question-len", 128, "tokens of each prompt's own question"),
                                ("output-len", 256, "output tokens of every request")):
        p.add_argument(f"--gsp-{flag}", type=int, default=default,
                       help=f"generated-shared-prefix: {what} (default: %(default)s)")
    for flag, default, what in (("conversations", 16, "conversations"), ("turns", 4, "turns a conversation"),
                                ("first-len", 1024, "tokens of a conversation's first prompt"),
                                ("tool-len", 128, "random tokens (a tool's result; chat-turns: the next user "
                                             "message) added after each answer")):
        p.add_argument(f"--agent-{flag}", type=int, default=default,
                       help=f"agent-turns and chat-turns: {what} (default: %(default)s)")
    p.add_argument("--num-prompts", type=int, default=100,
                   help="requests to send (default: %(default)s; generated-shared-prefix sends groups x prompts "
                        "per group)")
    p.add_argument("--disable-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--output-json", help="also write the figures here")


def _requests(ns: argparse.Namespace, tokenizer: PreTrainedTokenizerBase, seed: int) -> list[BenchRequest]:
    if ns.dataset_name == "generated-shared-prefix":
        return shared_prefix_requests(tokenizer, ns.gsp_num_groups, ns.gsp_prompts_per_group, ns.gsp_system_prompt_len,
                                      ns.gsp_question_len, ns.gsp_output_len, seed)
    if ns.dataset_name == "sharegpt":
        return sharegpt_requests(tokenizer, ns.dataset_path, ns.num_prompts, seed, ns.sharegpt_output_len,
                                 ns.sharegpt_context_len)
    return random_requests(tokenizer, ns.num_prompts, ns.input_len, ns.output_len, ns.random_range_ratio, seed)


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
    try:
        model, root = serve.served_model(base)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot ask {base} for its model ({type(e).__name__}: {e}) (hint: is the server up? "
                         f"--base-url names it)") from None
    tokenizer_path = ns.tokenizer or root
    if tokenizer_path is None:
        raise ValueError("the server does not say where its model is; pass --tokenizer")
    tokenizer = load_tokenizer(tokenizer_path)
    cfg = serve.ServeConfig(base, ns.model or model, ns.request_rate, ns.max_concurrency, not ns.disable_ignore_eos,
                            ns.seed)
    extra: dict = {}
    if ns.dataset_name in ("agent-turns", "chat-turns"):
        talks = serve.run_agents if ns.dataset_name == "agent-turns" else serve.run_chats
        results, duration, extra = talks(cfg, tokenizer, ns.agent_conversations, ns.agent_first_len, ns.agent_turns,
                                         ns.agent_tool_len, ns.output_len, progress=not ns.disable_tqdm)
    else:
        results, duration = asyncio.run(serve.run(cfg, _requests(ns, tokenizer, ns.seed), progress=not ns.disable_tqdm))
    figures = {**summarize(results, duration, ns.request_rate, ns.max_concurrency), **extra}
    print(format_block(figures, ns.backend))
    if extra:
        print("Mean / median TTFT by turn (ms): " + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in extra["turn_ttft_ms"]))
    failed = [r.error for r in results if not r.ok]
    if failed:
        print(f"{len(failed)} requests failed; first error: {failed[0]}", file=sys.stderr)
    _write(ns.output_json, {"backend": ns.backend, "dataset_name": ns.dataset_name, **figures})


def _offline(ns: argparse.Namespace) -> None:
    from minisgl.bench import offline
    from minisgl.llm import LLM
    from minisgl.server.cli_args import engine_args_from
    from minisgl.startup_checks import check_startup

    if ns.dataset_name in ("agent-turns", "chat-turns"):
        raise ValueError(f"--dataset-name {ns.dataset_name} needs a server: use `serve`")
    args = engine_args_from(ns)
    check_startup(args.device, args.model_path, args.load_format)
    llm = LLM(**dataclasses.asdict(args))
    figures = offline.run(llm, _requests(ns, llm.tokenizer, ns.seed), not ns.disable_ignore_eos)
    print(offline.format_block(figures))
    _write(ns.output_json, {"dataset_name": ns.dataset_name, **figures})


def build_parser(prog: str = "python -m minisgl.bench") -> argparse.ArgumentParser:
    from minisgl.server.cli_args import add_engine_args

    parser = argparse.ArgumentParser(prog=prog, description="Benchmark clients (sglang.bench_serving's flags).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="benchmark a running OpenAI-compatible server (minisgl, SGLang or vLLM)")
    p.add_argument("--base-url", default="http://127.0.0.1:30000", help="the server (default: %(default)s)")
    p.add_argument("--backend", default="minisgl", help="a label for the result block (default: %(default)s)")
    p.add_argument("--model", help="the model name to send (default: the server's only model)")
    p.add_argument("--tokenizer", help="a checkpoint folder whose tokenizer builds the prompts (default: the "
                                       "server's, from /get_model_info or /v1/models)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s, Poisson arrivals; inf = all at once (default: %(default)s)")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=1, help="for the prompts and the arrival times (default: %(default)s)")
    _common(p)
    p.set_defaults(func=_serve)
    p = sub.add_parser("offline", help="throughput of the offline LLM API")
    _common(p)
    add_engine_args(p)  # its --seed also seeds the prompts
    p.set_defaults(func=_offline)
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m minisgl.bench") -> None:
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    if ns.dataset_name == "sharegpt" and not ns.dataset_path:
        parser.exit(2, f"{prog} {ns.command}: error: --dataset-name sharegpt needs --dataset-path (a "
                       f"ShareGPT-format JSON file)\n")
    try:
        ns.func(ns)
    except ValueError as e:
        parser.exit(2, f"{prog} {ns.command}: error: {e}\n")


if __name__ == "__main__":
    main()
