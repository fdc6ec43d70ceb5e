"""Train the embedded default model and write it as package data: `python -m minisgl.models.tiny.train`.

A tiny Qwen3.5-MoE (default.trained_config: 6 GDN + 2 gated-attention layers, 8 experts, top-2,
a shared expert) learns to continue Python source (corpus.py) through the byte-level tokenizer,
with transformers' Qwen3_5MoeForCausalLM (its torch paths) as the trainer. It starts from
make_tiny_model's seed-0 random weights, so its initial state is ours, not a transformers version's.
In the last steps half of each batch is its own greedy continuations, which makes it decisive on
greedy paths (docs/tiny_model.md: what that buys the GPU alignment tests and what it costs).

Bit-for-bit reproducible on one machine: one thread, deterministic algorithms, fixed seeds and a
fixed data order. Float results can differ between CPU instruction sets and between torch or
transformers versions, so the manifest records the environment the shipped weights came from.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from minisgl.file_digest import sha256_file
from minisgl.models.tiny.corpus import DIGEST, Corpus, load_corpus
from minisgl.models.tiny.default import MANIFEST, SHIPPED_DIR, tokenizer_digest, trained_config, variant_name
from minisgl.models.tiny.make import tiny_tensors
from minisgl.models.tiny.tokenizer import ENDOFTEXT, build_tiny_tokenizer, special_token_ids
from minisgl.models.tiny.writer import to_disk, write_json, write_shards

ARCH = "qwen3_5_moe"
_PREFIX = "model.language_model."  # on disk; transformers' causal LM calls it "model."


@dataclass(frozen=True)
class TrainArgs:
    steps: int = 360
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1  # cosine decay from lr to lr * min_lr_ratio
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 60
    # From this step on, half of each batch is the model's own greedy continuations (generated anew
    # every self_distill_every steps): the tests score greedy paths, and this makes the model decisive along them.
    self_distill_from: int = 200
    self_distill_every: int = 80
    self_distill_prompts: int = 128
    self_distill_prompt_len: int = 32

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size, self.seq_len, self.eval_every, self.self_distill_every,
               self.self_distill_prompts) < 1:
            raise ValueError("steps, batch_size, seq_len, eval_every and the self_distill counts must be positive")
        if not 0 < self.self_distill_prompt_len < self.seq_len:
            raise ValueError("self_distill_prompt_len must be in 1 .. seq_len - 1")

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        t = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass(frozen=True)
class TrainResult:
    weights: dict[str, torch.Tensor]  # on-disk names, fp32
    report: dict


def tokenize(texts: tuple[str, ...], tok: Tokenizer) -> torch.Tensor:
    """All texts as one id stream, each file followed by <|endoftext|>."""
    eot = special_token_ids()[ENDOFTEXT]
    return torch.tensor([i for t in texts for i in (*tok.encode(t).ids, eot)], dtype=torch.long)


def unigram_loss(train: torch.Tensor, heldout: torch.Tensor, vocab: int) -> float:
    """Held-out cross-entropy (nats/token) of the add-one-smoothed token frequencies of the training text."""
    counts = Counter(train.tolist())
    total = len(train) + vocab
    return -sum(math.log((counts[t] + 1) / total) for t in heldout.tolist()) / len(heldout)


def _hf_model(config: dict, weights: dict[str, torch.Tensor]) -> Qwen3_5MoeForCausalLM:
    text = {k: v for k, v in config["text_config"].items() if k != "model_type"}
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**text))
    lm = {k: v for k, v in weights.items() if k.startswith(_PREFIX) or k == "lm_head.weight"}
    model.load_state_dict({k.replace(_PREFIX, "model.", 1): v for k, v in lm.items()}, strict=True)
    return model


def _on_disk(model: Qwen3_5MoeForCausalLM) -> dict[str, torch.Tensor]:
    return {(k.replace("model.", _PREFIX, 1) if k.startswith("model.") else k): v.detach().clone()
            for k, v in model.state_dict().items()}


def _token_losses(model: Qwen3_5MoeForCausalLM, seqs: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy [batch, len - 1] of each sequence."""
    logits = model(input_ids=seqs[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.transpose(1, 2).float(), seqs[:, 1:], reduction="none")


@torch.no_grad()
def greedy_continuations(model: Qwen3_5MoeForCausalLM, prompts: torch.Tensor, length: int) -> torch.Tensor:
    """The prompts [n, p] extended greedily to `length` tokens, with transformers' own cache."""
    was_training = model.training
    model.eval()
    out = model(input_ids=prompts, use_cache=True)
    seqs = [prompts]
    for _ in range(length - prompts.shape[1]):
        seqs.append(out.logits[:, -1:].argmax(-1))
        out = model(input_ids=seqs[-1], cache=out.cache, use_cache=True)
    model.train(was_training)
    return torch.cat(seqs, dim=1)


@torch.no_grad()
def heldout_loss(model: Qwen3_5MoeForCausalLM, ids: torch.Tensor, seq_len: int) -> float:
    """Mean next-token cross-entropy over consecutive windows of seq_len + 1 tokens (the tail is dropped)."""
    n = (len(ids) - 1) // seq_len
    windows = torch.stack([ids[i * seq_len : (i + 1) * seq_len + 1] for i in range(n)])
    was_training = model.training
    model.eval()
    losses = [float(_token_losses(model, windows[i : i + 16]).sum()) for i in range(0, n, 16)]
    model.train(was_training)
    return sum(losses) / (n * seq_len)


def environment() -> dict[str, str]:
    """What the bytes of a run depend on besides the corpus and the arguments."""
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


class _Batches:
    """Training batches in a fixed order: windows of the corpus and, once self-distillation has
    started, the model's greedy continuations of corpus prompts in the second half of each batch."""

    def __init__(self, args: TrainArgs, train_ids: torch.Tensor) -> None:
        self.args, self.ids = args, train_ids
        self.gen = torch.Generator().manual_seed(args.seed)
        self.own: torch.Tensor | None = None

    def _windows(self, n: int, length: int) -> torch.Tensor:
        offsets = torch.randint(0, len(self.ids) - length, (n,), generator=self.gen)
        return torch.stack([self.ids[o : o + length] for o in offsets.tolist()])

    def next(self, step: int, model: Qwen3_5MoeForCausalLM) -> tuple[torch.Tensor, int]:
        """The batch [batch_size, seq_len + 1] and how many of its last rows are greedy continuations."""
        a = self.args
        if step >= a.self_distill_from and (step - a.self_distill_from) % a.self_distill_every == 0:
            prompts = self._windows(a.self_distill_prompts, a.self_distill_prompt_len)
            self.own = greedy_continuations(model, prompts, a.seq_len + 1)
        n_own = 0 if self.own is None else a.batch_size // 2
        batch = self._windows(a.batch_size - n_own, a.seq_len + 1)
        if self.own is not None:
            batch = torch.cat([batch, self.own[torch.randint(0, len(self.own), (n_own,), generator=self.gen)]])
        return batch, n_own


def _parameters(model: Qwen3_5MoeForCausalLM, text_config: dict) -> dict[str, int]:
    t = text_config
    total = sum(p.numel() for p in model.parameters())
    idle_experts = (t["num_experts"] - t["num_experts_per_tok"]) * 3 * t["hidden_size"] * t["moe_intermediate_size"]
    return {"total": total, "active_per_token": total - t["num_hidden_layers"] * idle_experts}


def train(args: TrainArgs, corpus: Corpus, tok: Tokenizer, log: Callable[[str], None] = print) -> TrainResult:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    config = trained_config()
    model = _hf_model(config, tiny_tensors(ARCH, config, seed=args.seed))
    model.train()
    train_ids, heldout_ids = tokenize(corpus.train, tok), tokenize(corpus.heldout, tok)
    unigram = unigram_loss(train_ids, heldout_ids, config["text_config"]["vocab_size"])
    log(f"corpus: {len(train_ids)} training tokens, {len(heldout_ids)} held-out tokens; "
        f"unigram held-out loss {unigram:.3f} nats/token")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    batches = _Batches(args, train_ids)
    curve: list[dict] = []
    recent: list[float] = []
    corpus_rows = 0
    start = time.perf_counter()
    for step in range(args.steps):
        batch, n_own = batches.next(step, model)
        n_corpus = len(batch) - n_own
        corpus_rows += n_corpus
        for group in opt.param_groups:
            group["lr"] = args.lr_at(step)
        losses = _token_losses(model, batch)
        # A greedy row's prompt is corpus text, which the corpus rows cover; only its continuation counts.
        loss = torch.cat([losses[:n_corpus].flatten(), losses[n_corpus:, args.self_distill_prompt_len - 1 :].flatten()])
        opt.zero_grad(set_to_none=True)
        loss.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        recent = (recent + [losses[:n_corpus].mean().item()])[-args.eval_every :]
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            held = heldout_loss(model, heldout_ids, args.seq_len)
            curve.append({"step": step + 1, "train_loss": round(sum(recent) / len(recent), 4),
                          "heldout_loss": round(held, 4)})
            log(f"step {step + 1}: train loss {curve[-1]['train_loss']:.3f} (corpus rows, mean of the last "
                f"{len(recent)} steps), held-out loss {held:.3f}, {time.perf_counter() - start:.0f} s")
    report = {
        "args": asdict(args),
        "corpus_sha256": DIGEST,
        "tokens": {"train": len(train_ids), "heldout": len(heldout_ids), "seen": corpus_rows * args.seq_len},
        "parameters": _parameters(model, config["text_config"]),
        "unigram_heldout_loss": round(unigram, 4),
        "curve": curve,
    }
    return TrainResult(_on_disk(model), report)


def write_shipped(out_dir: str, result: TrainResult, tokenizer_sha256: str) -> dict[str, str]:
    """The BF16 and the FP8 (quantised from the BF16 values) weight shards and the manifest; returns the sums."""
    config = trained_config()
    sums: dict[str, str] = {}
    for fp8 in (False, True):
        variant = variant_name(fp8)
        tensors = to_disk(tiny_tensors(ARCH, config, 0, fp8, result.weights).items(), fp8)
        write_shards(os.path.join(out_dir, variant), tensors)
        for name in sorted(os.listdir(os.path.join(out_dir, variant))):
            sums[f"{variant}/{name}"] = sha256_file(os.path.join(out_dir, variant, name))
    write_json(os.path.join(out_dir, os.path.basename(MANIFEST)),
               {"sha256": sums, "tokenizer_sha256": tokenizer_sha256, "environment": environment(),
                "training": result.report})
    return sums


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minisgl.models.tiny.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=SHIPPED_DIR,
                   help="where the weights and the manifest go (default: the package data)")
    for name, default in asdict(TrainArgs()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    ns = p.parse_args(argv)
    try:
        args = TrainArgs(**{k: getattr(ns, k) for k in asdict(TrainArgs())})
        corpus = load_corpus()
    except ValueError as e:
        print(f"minisgl.models.tiny.train: error: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_tokenizer(tmp)
        tok = Tokenizer.from_file(os.path.join(tmp, "tokenizer.json"))
        tok_digest = tokenizer_digest(os.path.join(tmp, "tokenizer.json"))
    start, cpu_start = time.perf_counter(), time.process_time()
    result = train(args, corpus, tok)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    write_shipped(ns.out, result, tok_digest)
    report = result.report
    last, params, unigram = report["curve"][-1], report["parameters"], report["unigram_heldout_loss"]
    print(f"trained in {elapsed:.0f} s ({cpu:.0f} s of CPU, one thread, {environment()['cpu_capability']}): "
          f"held-out loss {last['heldout_loss']:.3f} vs unigram {unigram:.3f} nats/token; "
          f"{params['total']:,} parameters ({params['active_per_token']:,} active per token); wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
