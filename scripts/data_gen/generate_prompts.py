#!/usr/bin/env python3
"""Build a deterministic prompt pool: NUM prompts of exactly LEN tokens of the model's tokenizer,
cut from the text files under a local directory, in an order shuffled by SEED.

    generate_prompts.py --tokenizer MODEL_DIR --source-dir DIR --num-prompts 64 --prompt-len 1024 \
        --seed 0 --output pool.jsonl

Prints the pool's path and SHA-256; the same inputs always give the same bytes.
"""
from __future__ import annotations

import argparse
import sys

from minisgl.tokenizer.tokenizer import load_tokenizer
from minisgl.tools.align.prompt_pool import build_pool, write_pool


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, help="a checkpoint directory holding the tokenizer")
    p.add_argument("--source-dir", required=True, help="local text (.txt .md .rst .py files, recursively)")
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--prompt-len", type=int, required=True, help="tokens per prompt, exactly")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", required=True)
    ns = p.parse_args(argv)
    try:
        tokenizer = load_tokenizer(ns.tokenizer)
        prompts = build_pool(tokenizer, ns.source_dir, ns.num_prompts, ns.prompt_len, ns.seed)
        digest = write_pool(ns.output, prompts, tokenizer)
    except (ValueError, OSError) as e:
        print(f"generate_prompts: error: {e}", file=sys.stderr)
        return 2
    print(f"{ns.output} sha256 {digest} ({ns.num_prompts} prompts x {ns.prompt_len} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
