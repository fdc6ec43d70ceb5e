"""`python -m minisgl <command>`: make-tiny-model, generate, serve."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time


def _make_tiny_model(ns: argparse.Namespace) -> None:
    from minisgl.models.tiny.make import make_tiny_model

    path = make_tiny_model(ns.dir, arch=ns.arch, fp8=ns.fp8, seed=ns.seed, num_layers=ns.num_layers)
    print(f"wrote {ns.arch}{' fp8' if ns.fp8 else ''} checkpoint to {path}")


def _generate(ns: argparse.Namespace) -> None:
    from minisgl.afd.args import AfdArgs
    from minisgl.llm import LLM
    from minisgl.sampling_params import SamplingParams
    from minisgl.server.cli_args import dataclass_from, engine_args_from

    args = dataclasses.asdict(engine_args_from(ns))
    afd = dataclass_from(ns, AfdArgs, "afd_") if ns.afd else None
    params = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, ignore_eos=ns.ignore_eos)
    if ns.model_path is None:
        from minisgl.models.tiny.default import describe

        print(f"model: {describe()}\n")
    with LLM(afd=afd, **args) as llm:
        start = time.perf_counter()
        results = llm.generate(ns.prompt, params)
        elapsed = time.perf_counter() - start
        where = llm.scheduler.info.device
    for prompt, r in zip(ns.prompt, results):
        print(f"prompt: {prompt!r}\ncompletion: {r.text!r}\ntokens: {list(r.token_ids)} ({r.finish_reason})\n")
    n = sum(len(r.token_ids) for r in results)
    print(f"{n} tokens in {elapsed:.2f} s: {n / elapsed:.1f} tokens/s on {where}")
    if afd is not None and ns.check_colocated:
        colocated = LLM(**args).generate(ns.prompt, params)
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

    p.add_argument("--afd", action="store_true", help="attention-FFN disaggregation (the --afd-* flags)")
    add_dataclass_args(p, AfdArgs, "afd_")


def main(argv: list[str] | None = None) -> None:
    from minisgl.scheduler.args import SchedulerArgs
    from minisgl.server.args import ServerArgs
    from minisgl.server.cli_args import add_dataclass_args, add_engine_args

    parser = argparse.ArgumentParser(prog="minisgl")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny-model", help="write a small random checkpoint in the real Qwen3.5 layout")
    p.add_argument("dir")
    p.add_argument("--arch", choices=["qwen3_5_moe", "qwen3_moe"], default="qwen3_5_moe")
    p.add_argument("--fp8", action="store_true", help="block-128 FP8 weights with per-expert tensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-layers", type=int, default=None)
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("generate", help="offline generation: prompts in, completions and tokens/s out")
    p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--check-colocated", action="store_true", help="with --afd: also run colocated and compare tokens")
    add_engine_args(p)
    _add_afd_args(p)
    p.set_defaults(func=_generate)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (SGLang-style flags)")
    add_engine_args(p)
    add_dataclass_args(p, SchedulerArgs)
    add_dataclass_args(p, ServerArgs)
    _add_afd_args(p)
    p.set_defaults(func=_serve)

    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        ns.func(ns)
    except ValueError as e:  # bad flags or input: a message, not a traceback
        parser.exit(2, f"minisgl {ns.command}: error: {e}\n")


if __name__ == "__main__":
    main()
