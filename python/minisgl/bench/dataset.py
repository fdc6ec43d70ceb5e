"""The random dataset: prompts of random token ids (never special tokens), with lengths drawn
uniformly from [range_ratio * len, len] so that exact token counts reach the server."""
from __future__ import annotations

import random
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: tuple[int, ...]
    output_len: int


def random_requests(
    tokenizer: PreTrainedTokenizerBase, num: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[BenchRequest]:
    if not 0 <= range_ratio <= 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1], got {range_ratio}")
    if input_len < 1 or output_len < 1 or num < 1:
        raise ValueError("--input-len, --output-len and --num-prompts must be >= 1")
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [t for t in range(len(tokenizer)) if t not in special]

    def length(n: int) -> int:
        return rng.randint(max(1, int(n * range_ratio)), n)

    return [
        BenchRequest(tuple(rng.choices(vocab, k=length(input_len))), length(output_len)) for _ in range(num)
    ]
