"""The benchmark datasets (sglang.bench_serving's names):

- random: prompts of random token ids (never special tokens), lengths drawn uniformly from
  [range_ratio * len, len], so exact token counts reach the server;
- sharegpt: a ShareGPT-format JSON file (a list of {"conversations": [{"from", "value"}, ...]}):
  each conversation's first turn is the prompt, the second's token count the output length (or a
  fixed --sharegpt-output-len). Conversations are shuffled with the seed; ones under 4 tokens, and
  ones over the context (--sharegpt-context-len; by default SGLang's 1024-token prompt and
  2048-token total), are skipped;
- generated-shared-prefix: --gsp-num-groups groups of --gsp-prompts-per-group prompts; a group's
  prompts share a system prompt of --gsp-system-prompt-len random tokens, each followed by a
  question of its own (--gsp-question-len), all with --gsp-output-len output tokens; the requests
  are shuffled with the seed. This is the prefix cache's workload (many users of one system prompt);
- agent-turns (serve only): --agent-conversations conversations of --agent-turns turns; the first
  prompt is --agent-first-len random tokens, each later one the last prompt, its answer (as token
  ids) and --agent-tool-len random tokens, a tool's result: an agent's loop, which the prefix cache
  serves from what the last turn fed;
- chat-turns (serve only): the same conversations through /v1/chat/completions, as a chat client
  holds them: a first user message of random text (about --agent-first-len tokens), each answer's
  content sent back as the assistant's message and a next user message (about --agent-tool-len
  tokens); the server renders its chat template, which re-renders the last turn's end.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

DATASETS = ("random", "sharegpt", "generated-shared-prefix", "agent-turns", "chat-turns")
MIN_LEN = 4  # shorter prompts or answers say little about serving
DEFAULT_PROMPT_LIMIT, DEFAULT_TOTAL_LIMIT = 1024, 2048


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
    vocab = plain_vocab(tokenizer)

    def length(n: int) -> int:
        return rng.randint(max(1, int(n * range_ratio)), n)

    return [
        BenchRequest(tuple(rng.choices(vocab, k=length(input_len))), length(output_len)) for _ in range(num)
    ]


def plain_vocab(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [t for t in range(len(tokenizer)) if t not in special]


def shared_prefix_requests(
    tokenizer: PreTrainedTokenizerBase, groups: int, per_group: int, system_len: int, question_len: int,
    output_len: int, seed: int,
) -> list[BenchRequest]:
    if min(groups, per_group, system_len, question_len, output_len) < 1:
        raise ValueError("--gsp-num-groups, --gsp-prompts-per-group, --gsp-system-prompt-len, --gsp-question-len "
                         "and --gsp-output-len must be >= 1")
    rng = random.Random(seed)
    vocab = plain_vocab(tokenizer)
    out = []
    for _ in range(groups):
        system = rng.choices(vocab, k=system_len)
        out += [BenchRequest(tuple(system + rng.choices(vocab, k=question_len)), output_len) for _ in range(per_group)]
    rng.shuffle(out)
    return out


def _conversations(path: str) -> list[tuple[str, str]]:
    """(first turn, second turn) of every conversation with at least two turns."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--dataset-path {path!r}: cannot read a ShareGPT JSON file: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path!r}: a ShareGPT file is a JSON list of conversations")
    pairs = []
    for i, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value"), str)
                                                  for t in turns):
            raise ValueError(f"--dataset-path {path!r}: item {i} needs a \"conversations\" list of "
                             f"{{\"from\", \"value\"}} turns")
        if len(turns) >= 2:
            pairs.append((turns[0]["value"], turns[1]["value"]))
    return pairs


def sharegpt_requests(
    tokenizer: PreTrainedTokenizerBase, path: str, num: int, seed: int, output_len: int | None = None,
    context_len: int | None = None,
) -> list[BenchRequest]:
    if num < 1:
        raise ValueError("--num-prompts must be >= 1")
    if output_len is not None and output_len < MIN_LEN:
        raise ValueError(f"--sharegpt-output-len must be >= {MIN_LEN}, got {output_len}")
    pairs = _conversations(path)
    random.Random(seed).shuffle(pairs)
    out: list[BenchRequest] = []
    for prompt, answer in pairs:
        ids = tokenizer.encode(prompt)
        n_out = output_len if output_len is not None else len(tokenizer.encode(answer, add_special_tokens=False))
        if len(ids) < MIN_LEN or n_out < MIN_LEN:
            continue
        too_long = (len(ids) + n_out > context_len if context_len is not None
                    else len(ids) > DEFAULT_PROMPT_LIMIT or len(ids) + n_out > DEFAULT_TOTAL_LIMIT)
        if too_long:
            continue
        out.append(BenchRequest(tuple(ids), n_out))
        if len(out) == num:
            return out
    raise ValueError(f"--dataset-path {path!r}: {len(out)} of its {len(pairs)} conversations fit (at least "
                     f"{MIN_LEN} tokens each way, within the context); --num-prompts asks for {num}")
