"""Prompt pools: deterministic sets of prompts of exactly N tokens, cut from local text (these
machines cannot download), stored as JSON lines {"id", "prompt_token_ids", "text"}.

The ids are what every run sends; the text is for people. The same files, seed and tokenizer give
the same bytes, so a pool's SHA-256 names it in every report.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minisgl.file_digest import sha256_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")


@dataclass(frozen=True)
class Prompt:
    id: int
    token_ids: tuple[int, ...]


def _text_files(source_dir: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in files if f.endswith(TEXT_SUFFIXES)]
    return sorted(found, key=lambda p: os.path.relpath(p, source_dir))


def _token_stream(tokenizer: PreTrainedTokenizerBase, files: list[str], need: int) -> Iterator[int]:
    """Token ids of the files in order, separated by a blank line, until `need` ids came out."""
    given = 0
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            ids = tokenizer.encode(f.read() + "\n\n", add_special_tokens=False)[: need - given]
        yield from ids
        given += len(ids)
        if given == need:
            return


def build_pool(
    tokenizer: PreTrainedTokenizerBase, source_dir: str, num_prompts: int, prompt_len: int, seed: int
) -> list[Prompt]:
    """Consecutive, disjoint windows of prompt_len tokens over the source's text files, taken in
    an order shuffled by seed."""
    if num_prompts < 1 or prompt_len < 1:
        raise ValueError(f"need num_prompts >= 1 and prompt_len >= 1, got {num_prompts} and {prompt_len}")
    files = _text_files(source_dir)
    if not files:
        raise ValueError(f"no {'/'.join(TEXT_SUFFIXES)} files under {source_dir!r}")
    random.Random(seed).shuffle(files)
    need = num_prompts * prompt_len
    stream = list(_token_stream(tokenizer, files, need))
    if len(stream) < need:
        raise ValueError(f"{source_dir!r} has {len(stream)} tokens of text; {num_prompts} prompts of "
                         f"{prompt_len} tokens need {need}")
    return [Prompt(i, tuple(stream[i * prompt_len : (i + 1) * prompt_len])) for i in range(num_prompts)]


def write_pool(path: str, prompts: list[Prompt], tokenizer: PreTrainedTokenizerBase) -> str:
    """Write the pool and return its SHA-256."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            text = tokenizer.decode(list(p.token_ids))
            f.write(json.dumps({"id": p.id, "prompt_token_ids": list(p.token_ids), "text": text},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
    return sha256_file(path)


def read_pool(path: str, limit: int | None = None) -> list[Prompt]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row.get("prompt_token_ids")
            if not ids or not all(isinstance(t, int) for t in ids):
                raise ValueError(f"{path}:{n}: needs a non-empty prompt_token_ids list of ints")
            prompts.append(Prompt(int(row.get("id", len(prompts))), tuple(ids)))
            if limit is not None and len(prompts) == limit:
                break
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts
