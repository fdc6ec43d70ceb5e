"""The token history that repetition, presence and frequency penalties read, kept on the device.

A penalised request owns one row: which tokens its prompt holds, and how often each token has
appeared in its output. The output counts are bumped on the device right after each sample, so a
step launched before the host has seen the previous step's tokens (the overlap loop, AFD) still
penalises them. Rows exist only for penalised requests and the table doubles when it runs out (up
to max_rows), so an engine whose requests never use penalties holds no [requests, vocab] table.
"""
from __future__ import annotations

from typing import Sequence

import torch

from minisgl.host_copy import to_device


class TokenHistory:
    def __init__(self, vocab_size: int, device: torch.device, max_rows: int | None = None) -> None:
        self.vocab_size, self.device, self.max_rows = vocab_size, device, max_rows
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self.in_prompt = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self._row: dict[int, int] = {}
        self._free: list[int] = []

    def __contains__(self, key: int) -> bool:
        return key in self._row

    def add(self, key: int) -> None:
        if key in self._row:
            raise ValueError(f"token history: key {key} is already live")
        if not self._free:
            self._grow()
        row = self._free.pop()
        self.output_counts[row].zero_()
        self.in_prompt[row].zero_()
        self._row[key] = row

    def remove(self, key: int) -> None:
        row = self._row.pop(key, None)
        if row is not None:
            self._free.append(row)

    def rows(self, keys: Sequence[int]) -> torch.Tensor:
        return to_device([self._row[k] for k in keys], torch.int64, self.device)

    def see_prompt(self, key: int, tokens: Sequence[int]) -> None:
        """Mark a chunk of key's prompt (prompts arrive chunk by chunk under chunked prefill)."""
        if tokens:
            self.in_prompt[self._row[key], to_device(list(tokens), torch.int64, self.device)] = True

    def record(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count one sampled token per row, on the device."""
        ones = torch.ones(rows.shape[0], dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((rows, tokens), ones, accumulate=True)

    def _grow(self) -> None:
        old = self.output_counts.shape[0]
        new = max(4, 2 * old) if self.max_rows is None else min(max(4, 2 * old), max(self.max_rows, old + 1))
        counts = torch.zeros(new, self.vocab_size, dtype=torch.int32, device=self.device)
        seen = torch.zeros(new, self.vocab_size, dtype=torch.bool, device=self.device)
        counts[:old] = self.output_counts
        seen[:old] = self.in_prompt
        self.output_counts, self.in_prompt = counts, seen
        self._free.extend(range(new - 1, old - 1, -1))  # pop() hands out the lowest row first
