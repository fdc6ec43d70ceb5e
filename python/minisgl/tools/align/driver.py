"""`python -m minisgl.tools.align`: teacher-forced alignment of a candidate against a reference.

    sample  greedy completions (temperature 0, EOS ignored) of a prompt pool from the candidate
            -> OUT/sample.json
    score   each prompt + completion scored by the reference: the rank and logprob of every
            generated token, and the reference's own top-1 -> OUT/alignment.json; gates checked
    all     both (the default)

The stages run apart so that a candidate and a reference that each need every GPU can take turns.
Exit status: 0 pass, 1 a gate failed (a summary says which), 2 a usage or protocol error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from minisgl.file_digest import sha256_file
from minisgl.tools.align.candidate import Sample, ServerCandidate
from minisgl.tools.align.http import CompletionsClient
from minisgl.tools.align.metrics import Gates, Metrics, TokenScore, metrics, overall
from minisgl.tools.align.prompt_pool import read_pool
from minisgl.tools.align.reference import Reference, ServerReference
from minisgl.tools.align.wire import NO_TOKEN_IDS

SAMPLE_FILE = "sample.json"
ALIGNMENT_FILE = "alignment.json"


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def _reference(ns: argparse.Namespace, sample: dict[str, Any]) -> Reference:
    if bool(ns.reference) == bool(ns.reference_url):
        raise ValueError("give exactly one reference: --reference hf or --reference-url URL")
    if ns.reference_url:
        return ServerReference(CompletionsClient(ns.reference_url, ns.reference_name, ns.concurrency,
                                                 ns.request_timeout))
    # The same checkpoint as the candidate server, unless told otherwise.
    path = ns.reference_model or sample["candidate"].get("model_path")
    if not path:
        raise ValueError("--reference hf needs the checkpoint: --reference-model DIR")
    # Imported here: torch and transformers load in seconds, and only this reference needs them.
    from minisgl.tools.align.hf_reference import HfReference

    return HfReference(path, ns.reference_dtype)


def run_sample(ns: argparse.Namespace) -> dict[str, Any]:
    if not ns.candidate_url or not ns.prompts:
        raise ValueError("the sample stage needs --candidate-url and --prompts")
    prompts = read_pool(ns.prompts, ns.num_prompts)
    candidate = ServerCandidate(CompletionsClient(ns.candidate_url, ns.candidate_name, ns.concurrency,
                                                  ns.request_timeout))
    try:
        start = time.perf_counter()
        samples = candidate.generate(prompts, ns.max_new_tokens)
        wall = time.perf_counter() - start
        described = candidate.describe()
    finally:
        candidate.close()
    empty = [s.id for s in samples if not s.num_tokens]
    if empty:
        raise ValueError(f"the candidate returned no tokens for prompts {empty[:10]}")
    if any(s.completion_token_ids is None for s in samples):
        print(f"align: warning: {NO_TOKEN_IDS}", file=sys.stderr)
    tokens = sum(s.num_tokens for s in samples)
    doc = {
        "prompts": {"path": os.path.abspath(ns.prompts), "sha256": sha256_file(ns.prompts), "count": len(prompts)},
        "candidate": described,
        "max_new_tokens": ns.max_new_tokens,
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall,
        "samples": [s.to_json() for s in samples],
    }
    _write_json(os.path.join(ns.out, SAMPLE_FILE), doc)
    print(f"sampled {len(samples)} prompts x {ns.max_new_tokens} tokens in {wall:.1f} s "
          f"({tokens / wall:.1f} tokens/s) -> {os.path.join(ns.out, SAMPLE_FILE)}")
    return doc


def _first_mismatch(scores: list[TokenScore]) -> dict[str, Any] | None:
    i = next((i for i, s in enumerate(scores) if s.rank != 1), None)
    if i is None:
        return None
    s = scores[i]
    return {"position": i, "token_id": s.token_id, "rank": s.rank, "logprob": s.logprob, "ref_top1": s.ref_top1}


def summary(m: Metrics, n_prompts: int, gates: Gates, failures: list[str], reference: str) -> str:
    first = "none" if m.first_non_top1 is None else f"token {m.first_non_top1}"
    lines = [
        f"alignment: {n_prompts} prompts, {m.tokens} tokens, reference {reference}",
        f"  top-1 agreement   {m.top1:.4f}   (gate >= {gates.min_top1})",
        f"  top-10 hit rate   {m.top10:.4f}   (gate >= {gates.min_top10})",
        f"  top-100 hit rate  {m.top100:.4f}",
        f"  rank mean / max   {m.mean_rank:.3f} / {m.max_rank}",
        f"  mean logprob      {m.mean_logprob:.4f}   perplexity {m.perplexity:.4f}",
        f"  first non-top-1   {first}",
    ]
    lines += [f"FAIL: {f}" for f in failures] or ["PASS"]
    return "\n".join(lines)


def run_score(ns: argparse.Namespace, sample: dict[str, Any]) -> bool:
    samples = [Sample.from_json(d) for d in sample["samples"]]
    reference = _reference(ns, sample)
    try:
        per_prompt = reference.score(samples)
        described = reference.describe()
    finally:
        reference.close()
    gates = Gates(ns.min_top1, ns.min_top10)
    total = overall(per_prompt)
    failures = gates.failures(total)
    doc = {
        "sample": os.path.abspath(os.path.join(ns.out, SAMPLE_FILE)),
        "prompts": sample["prompts"],
        "candidate": sample["candidate"],
        "reference": described,
        "gates": {"min_top1": gates.min_top1, "min_top10": gates.min_top10},
        "passed": not failures,
        "failures": failures,
        "overall": total.to_json(),
        "per_prompt": [{"id": s.id, **metrics(sc).to_json(), "first_mismatch": _first_mismatch(sc)}
                       for s, sc in zip(samples, per_prompt)],
    }
    _write_json(os.path.join(ns.out, ALIGNMENT_FILE), doc)
    print(summary(total, len(samples), gates, failures, described.get("url") or described.get("model_path", "")))
    print(f"-> {os.path.join(ns.out, ALIGNMENT_FILE)}")
    return not failures


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minisgl.tools.align", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=["all", "sample", "score"], default="all")
    p.add_argument("--out", required=True, help="directory for sample.json and alignment.json")
    p.add_argument("--prompts", help="prompt pool (JSON lines with prompt_token_ids); the sample stage needs it")
    p.add_argument("--num-prompts", type=int, default=None, help="the first N prompts of the pool (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per server")
    p.add_argument("--request-timeout", type=float, default=1800.0, help="seconds for one request")
    g = p.add_argument_group("candidate")
    g.add_argument("--candidate-url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    g.add_argument("--candidate-name", help="its model name (default: the server's first model)")
    g = p.add_argument_group("reference")
    g.add_argument("--reference", choices=["hf"], help="HF transformers in this process, on the same checkpoint")
    g.add_argument("--reference-model", help="the checkpoint for --reference hf (default: the candidate server's)")
    g.add_argument("--reference-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="bfloat16 halves the memory of a large model's reference")
    g.add_argument("--reference-url", help="a server that returns vLLM's prompt_logprobs (vLLM, SGLang, minisgl)")
    g.add_argument("--reference-name", help="its model name (default: the server's first model)")
    g = p.add_argument_group("gates")
    g.add_argument("--min-top1", type=float, default=0.0)
    g.add_argument("--min-top10", type=float, default=1.0)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        os.makedirs(ns.out, exist_ok=True)
        if ns.stage in ("all", "sample"):
            sample = run_sample(ns)
        else:
            with open(os.path.join(ns.out, SAMPLE_FILE)) as f:
                sample = json.load(f)
        if ns.stage == "sample":
            return 0
        return 0 if run_score(ns, sample) else 1
    except (ValueError, OSError) as e:  # WireError is a ValueError: say what the server must support
        print(f"align: error: {e}", file=sys.stderr)
        return 2
