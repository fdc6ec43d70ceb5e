"""Token embedding whose table the loader fills; vocabulary-parallel under TP: each rank holds a
contiguous slice of the rows, looks up the ids that fall in it and the ranks' rows are summed
(every id is in exactly one slice, so the sum adds only zeros to it: exact)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.parallel.collectives import all_reduce
from minisgl.parallel.config import SINGLE, ParallelConfig
from minisgl.parallel.shard import Shard


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, parallel: ParallelConfig = SINGLE) -> None:
        super().__init__()
        self.parallel = parallel
        self.vocab_start, end = parallel.part(vocab_size)
        self.weight = nn.Parameter(torch.empty(end - self.vocab_start, hidden), requires_grad=False)
        if parallel.tp_size > 1:
            self.shards = {"weight": Shard.along((vocab_size, hidden), 0, (self.vocab_start, end))}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(torch.where(inside, local, 0), self.weight)
        return all_reduce(x.masked_fill_(~inside[:, None], 0), self.parallel)
