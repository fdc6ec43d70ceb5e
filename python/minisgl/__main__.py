"""`python -m minisgl <command>` (or `minisgl <command>`): make-tiny-model, generate, serve, bench."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from minisgl.version import __version__

EPILOG = """benchmarks: `minisgl bench serve --base-url URL ...` measures a running server (SGLang's
bench_serving flags and result block); `minisgl bench offline ...` the offline LLM API. Both are
also `python -m minisgl.bench`."""


def _make_tiny_model(ns: argparse.Namespace) -> None:
    from minisgl.models.tiny.make import make_tiny_model

    path = make_tiny_model(ns.dir, arch=ns.arch, fp8=ns.fp8, seed=ns.seed, num_layers=ns.num_layers)
    print(f"wrote {ns.arch}{' fp8' if ns.fp8 else ''} checkpoint to {path}")


def _generate(ns: argparse.Namespace) -> None:
    from minisgl.afd.args import AfdArgs
    from minisgl.llm import LLM
    from minisgl.sampling_params import SamplingParams
    from minisgl.server.cli_args import dataclass_from, engine_args_from
    from minisgl.startup_checks import check_startup

    engine_args = engine_args_from(ns)
    check_startup(engine_args.device, engine_args.model_path, engine_args.load_format)
    args = dataclasses.asdict(engine_args)
    afd = dataclass_from(ns, AfdArgs, "afd_") if ns.afd else None
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, ignore_eos=ns.ignore_eos)
    if ns.model_path is None:
        from minisgl.models.tiny.default import describe

        print(f"model: {describe()}\n")
    with LLM(afd=afd, **args) as llm:
        start = time.perf_counter()
        results = llm.generate(ns.prompt, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        where = llm.scheduler.info.device
    for prompt, r in zip(ns.prompt, results):
        print(f"prompt: {prompt!r}\ncompletion: {r.text!r}\ntokens: {list(r.token_ids)} ({r.finish_reason})\n")
    n = sum(len(r.token_ids) for r in results)
    print(f"{n} tokens in {elapsed:.2f} s: {n / elapsed:.1f} tokens/s on {where}")
    if afd is not None and ns.check_colocated:
        colocated = LLM(**args).generate(ns.prompt, params, use_tqdm=False)
        same = [a.token_ids == b.token_ids for a, b in zip(results, colocated)]
        print(f"AFD {afd.attn_workers}+{afd.expert_workers} tokens match colocated: {'yes' if all(same) else 'NO'}")
        if not all(same):
            raise SystemExit(1)


def _serve(ns: argparse.Namespace) -> None:
    from minisgl.afd.args import AfdArgs
    from minisgl.scheduler.args import SchedulerArgs
    from minisgl.server.args import ServerArgs
    from minisgl.server.cli_args import dataclass_from, engine_args_from
    from minisgl.server.launch import serve

    afd = dataclass_from(ns, AfdArgs, "afd_") if ns.afd else None
    serve(engine_args_from(ns), dataclass_from(ns, SchedulerArgs), dataclass_from(ns, ServerArgs), afd)


def _add_afd_args(p: argparse.ArgumentParser) -> None:
    from minisgl.afd.args import AfdArgs
    from minisgl.server.cli_args import add_dataclass_args

    p.add_argument("--afd", action="store_true", help="attention-FFN disaggregation: attention and routed experts "
                                                      "on separate worker processes (the --afd-* flags)")
    add_dataclass_args(p, AfdArgs, "afd_")


def build_parser() -> argparse.ArgumentParser:
    from minisgl.scheduler.args import SchedulerArgs
    from minisgl.server.args import ServerArgs
    from minisgl.server.cli_args import add_dataclass_args, add_engine_args

    parser = argparse.ArgumentParser(prog="minisgl", description="An LLM serving engine for MoE models.",
                                     epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"minisgl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny-model", help="write a small random checkpoint in the real Qwen3.5 layout")
    p.add_argument("dir", help="the folder to write (config.json, safetensors, tokenizer)")
    p.add_argument("--arch", choices=["qwen3_5_moe", "qwen3_moe"], default="qwen3_5_moe",
                   help="the architecture (default: %(default)s)")
    p.add_argument("--fp8", action="store_true", help="block-128 FP8 weights with per-expert tensors")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: %(default)s)")
    p.add_argument("--num-layers", type=int, default=None, help="decoder layers (default: the tiny config's)")
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("generate", help="offline generation: prompts in, completions and tokens/s out")
    p.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--check-colocated", action="store_true", help="with --afd: also run colocated and compare tokens")
    add_engine_args(p)
    add_dataclass_args(p, ServerArgs, only=("log_level",))
    _add_afd_args(p)
    p.set_defaults(func=_generate)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (SGLang-style flags)")
    add_engine_args(p)
    add_dataclass_args(p, SchedulerArgs)
    add_dataclass_args(p, ServerArgs)
    _add_afd_args(p)
    p.set_defaults(func=_serve)

    # Listed for --help; `minisgl bench ...` is handed to the bench tool's own parser (main below).
    sub.add_parser("bench", help="benchmark clients: `bench serve` (a running server, SGLang's bench_serving "
                                 "figures) and `bench offline` (the LLM API); see `minisgl bench --help`")
    return parser


def main(argv: list[str] | None = None) -> None:
    from minisgl.process_setup import set_log_level, setup_logging

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from minisgl.bench.__main__ import main as bench_main

        return bench_main(argv[1:], prog="minisgl bench")
    parser = build_parser()
    ns = parser.parse_args(argv)
    set_log_level(getattr(ns, "log_level", "info"))  # every process started from here inherits it
    setup_logging(ns.command)
    try:
        ns.func(ns)
    except ValueError as e:  # bad flags or input: one line saying what and how to fix it, not a traceback
        parser.exit(2, f"minisgl {ns.command}: error: {e}\n")


if __name__ == "__main__":
    main()
