"""AFD 1+1 on one GPU against the colocated engine on the same seeded dummy weights (default: the
Qwen3.5-122B-A10B FP8 config): teacher-forced top-1 agreement, greedy decode agreement, and the
decode step time of AFD with graphs against AFD eager (and the colocated engine's, for scale).

    python benchmarks/afd_agreement.py --out $OUT/afd_agreement.json [--model NAME] [--num-mb 1]

Every phase runs in its own process (the GPU holds one copy of the weights at a time):

- colocated: greedy continuations of `--prompts` random prompts (`--positions` tokens each: the
  reference), then the teacher-forced set: for every prompt i and position j one request of
  prompt_i + reference_i[:j] with one greedy token, whose token is the engine's top-1 there.
- afd-graphs, afd-eager: the same two runs through the coordinator (1 attention worker with
  everything but the routed experts, 1 expert worker with all of them, the ipc transport), the
  decode steps in CUDA graphs or eager.
- Each phase also times `--batch` decodes of `--steps` steps after a `--timing-prompt`-token
  prompt: (generate with steps + 1 tokens - generate with 1) / steps, the prefill left out.

On one GPU both workers time-share the device: the AFD step times bound the host path (what graphs
remove) and add both roles' kernels, but say nothing of the exchange between distinct GPUs.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

PHASES = ("colocated", "afd-graphs", "afd-eager")


def model_path(name: str, root: str) -> str:
    """A model dir as given, or for a known config's name a config-only FP8 dir with the model's
    full vocabulary in a synthetic tokenizer."""
    from full_vocab_tokenizer import write_full_vocab_tokenizer
    from minisgl.models.known_configs import config_dir, hf_config

    if os.path.isdir(name):
        return name
    path = config_dir(name, fp8=True, root=root)
    text = hf_config(name, True)["text_config"]
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        write_full_vocab_tokenizer(path, text["vocab_size"], text["bos_token_id"])
    return path


def greedy(n: int):
    from minisgl import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def decode_timing(llm, batch: int, prompt_len: int, steps: int, vocab: int) -> dict:
    """The decode step's wall ms; under AFD also each worker's host ms launching a decode step."""
    from minisgl.afd.launch_times import mean_ms_between

    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, vocab, (prompt_len,), generator=g).tolist() for _ in range(batch)]
    afd = getattr(llm.scheduler, "decode_launch", None)
    t0 = time.monotonic()
    llm.generate(prompts, greedy(1), use_tqdm=False)
    t1 = time.monotonic()
    before = afd.totals() if afd is not None else {}
    llm.generate(prompts, greedy(steps + 1), use_tqdm=False)
    t2 = time.monotonic()
    out = {"decode_ms": round(((t2 - t1) - (t1 - t0)) / steps * 1e3, 2)}
    if afd is not None:
        out["launch_ms"] = mean_ms_between(before, afd.totals())
    return out


def run_phase(phase: str, args: argparse.Namespace, ref: dict | None) -> dict:
    from minisgl import LLM
    from minisgl.afd.args import AfdArgs
    from minisgl.models.config import load_config

    path = model_path(args.model, args.root)
    engine = dict(device=args.device, load_format="dummy", seed=0, page_size=16, context_length=args.context,
                  max_running_requests=args.max_running, num_pages=args.max_running * args.context // 16 + 1,
                  cuda_graph_max_bs=args.batch, disable_cuda_graph=phase == "afd-eager")
    afd = None
    if phase != "colocated":
        on_gpu = dict(gpus=1, transport="ipc") if args.device == "cuda" else {}
        afd = AfdArgs(attn_workers=1, expert_workers=1, num_mb=args.num_mb, graph_buckets=True, warmup="on",
                      step_timeout_s=120, **on_gpu)
    started = time.monotonic()
    out: dict = {"phase": phase}
    with LLM(path, afd=afd, **engine) as llm:
        out["ready_s"] = round(time.monotonic() - started, 1)
        vocab = load_config(path).vocab_size
        if ref is None:
            g = torch.Generator().manual_seed(3)
            prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
        else:
            prompts = ref["prompts"]
        out["prompts"] = prompts
        out["greedy"] = [list(r.token_ids) for r in llm.generate(prompts, greedy(args.positions), use_tqdm=False)]
        reference = out["greedy"] if ref is None else ref["greedy"]
        forced = [p + c[:j] for p, c in zip(prompts, reference) for j in range(args.positions)]
        out["forced_top1"] = [r.token_ids[0] for r in llm.generate(forced, greedy(1), use_tqdm=False)]
        out.update(decode_timing(llm, args.batch, args.timing_prompt, args.steps, vocab))
        if afd is not None:
            out["graph_steps"] = llm.scheduler.graph_steps
            out["warmup"] = llm.scheduler.warmup.describe()
    return out


def compare(ref: dict, got: dict) -> dict:
    """Teacher-forced top-1 agreement, and per prompt the greedy steps equal before the first difference."""
    pairs = list(zip(ref["forced_top1"], got["forced_top1"]))
    same = []
    for want, have in zip(ref["greedy"], got["greedy"]):
        n = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), len(want))
        same.append(n)
    return {"teacher_forced_top1": sum(a == b for a, b in pairs) / len(pairs), "positions": len(pairs),
            "greedy_steps_equal": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen3.5-122B-A10B", help="a known config's name, or a model dir")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on a small model dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--reference", help="an earlier run's JSON whose colocated phase (same flags) is the reference")
    ap.add_argument("--num-mb", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--positions", type=int, default=64, help="greedy tokens per prompt, each a teacher-forced position")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--timing-prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--max-running", type=int, default=40)
    ap.add_argument("--phase-timeout", type=float, default=None, help="seconds before a phase is stopped")
    ap.add_argument("--root", default=None, help="where the config-only model dir goes (default: a temp dir)")
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # internal: one phase, in this process
    args = ap.parse_args()
    args.root = args.root or tempfile.mkdtemp()
    if args.phase is not None:
        ref = None
        if args.phase != "colocated":
            with open(args.out) as f:
                ref = json.load(f)["colocated"]
        result = run_phase(args.phase, args, ref)
        with open(args.out + f".{args.phase}", "w") as f:
            json.dump(result, f)
        return
    results: dict = {"model": args.model, "num_mb": args.num_mb, "batch": args.batch}
    if args.reference:
        with open(args.reference) as f:
            results["colocated"] = json.load(f)["colocated"]
    for phase in args.phases.split(","):
        with open(args.out, "w") as f:
            json.dump(results, f)
        argv = [sys.executable, os.path.abspath(__file__), "--phase", phase, *sys.argv[1:], "--root", args.root]
        started = time.monotonic()
        proc = subprocess.Popen(argv, start_new_session=True)  # its AFD workers too, in one group to stop
        try:
            code = proc.wait(timeout=args.phase_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = "timed out"
        if code != 0:
            results[phase] = {"failed": code}
            print(f"{phase}: {code}", flush=True)
            continue
        with open(args.out + f".{phase}") as f:
            results[phase] = json.load(f)
        results[phase]["wall_s"] = round(time.monotonic() - started, 1)
        if phase == "colocated":  # its prefill's top-1 against its own greedy decode
            got = results[phase]
            flat = [t for c in got["greedy"] for t in c]
            got["prefill_vs_own_decode"] = sum(a == b for a, b in zip(flat, got["forced_top1"])) / len(flat)
        elif "forced_top1" in results.get("colocated", {}):
            results[phase]["vs_colocated"] = compare(results["colocated"], results[phase])
        summary = {k: v for k, v in results[phase].items() if k not in ("prompts", "greedy", "forced_top1")}
        print(f"{phase}: {json.dumps(summary)}", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
