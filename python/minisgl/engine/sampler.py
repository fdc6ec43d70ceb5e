"""Next-token choice from fp32 logits, with vLLM's parameters and order:

1. min_tokens masks EOS and stop_token_ids while the output is shorter; logit_bias is added;
2. repetition, frequency and presence penalties read the request's token history;
3. greedy rows take the argmax of that; sampled rows divide by their temperature, drop tokens under
   min_p times the top probability, keep their top_k and top_p, and draw from their generator.

Requests are registered by key (their state slot) with their params and generator; the sampler
counts each key's samples itself, so min_tokens needs nothing from the caller. A step works on
the whole batch at once: the host builds index lists from what it already knows and copies them
without waiting, every filter runs batched on the device, and each generator draws once for all
its rows (unseeded requests share one); nothing in a step waits for the device. Logprobs are not
taken here: they describe the raw logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minisgl.engine.token_history import TokenHistory
from minisgl.host_copy import to_device
from minisgl.sampling_params import SamplingParams

_I64, _F32 = torch.int64, torch.float32
# Penalised and sampled rows are adjusted, filtered and drawn this many at a time: each holds ~8
# vocabulary-wide fp32 temporaries (the sort, its indices, softmax, cumsum, noise), ~8 MiB a row at
# a 248K vocabulary, so a whole batch at once would make every running request cost that much.
FILTER_ROWS = 32


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, mask logits outside its top_k (ties kept) and outside the smallest set whose
    probability reaches its top_p. logits [R, V]; top_k [R] (V = off); top_p [R] (inf = off)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    kth = sorted_logits.gather(1, (top_k - 1)[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass before it already reaches top_p; the top token always stays
    # (explicitly: a top_p that rounds to 0 in fp32 would otherwise drop it too).
    drop = (probs.cumsum(-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p [R] times their row's top probability."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < probs.amax(-1, keepdim=True) * min_p[:, None], float("-inf"))


def apply_penalties(
    logits: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor,
    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
) -> torch.Tensor:
    """logits [R, V]; counts [R, V] output occurrences; in_prompt [R, V] bool; penalties [R].
    A token seen anywhere has a positive logit divided by, a negative one multiplied by, the
    repetition penalty; output tokens then lose frequency x count and presence once."""
    counts = counts.to(logits.dtype)
    in_output = counts > 0
    rep = repetition[:, None]
    seen = in_prompt | in_output
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * in_output.to(logits.dtype)


@dataclass
class _Live:
    params: SamplingParams
    generator: torch.Generator | None
    num_sampled: int = 0


class Sampler:
    def __init__(
        self, vocab_size: int, device: torch.device, eos_token_ids: Sequence[int], max_requests: int | None = None
    ) -> None:
        """max_requests: how many keys can be live at once (the pool's slots), which caps the history."""
        self.vocab_size, self.device = vocab_size, torch.device(device)
        self.eos = tuple(eos_token_ids)
        self.history = TokenHistory(vocab_size, self.device, max_requests)
        self._live: dict[int, _Live] = {}

    # -- requests -------------------------------------------------------------------------------
    def add(self, key: int, params: SamplingParams, generator: torch.Generator | None) -> None:
        if key in self._live:
            raise ValueError(f"sampler: key {key} is already live")
        self._live[key] = _Live(params, generator)
        if params.penalised:
            self.history.add(key)

    def see_prompt(self, key: int, tokens: Sequence[int]) -> None:
        """Feed a chunk of key's prompt; only the repetition penalty reads it."""
        if key in self.history:
            self.history.see_prompt(key, tokens)

    def remove(self, key: int) -> None:
        self._live.pop(key, None)
        self.history.remove(key)

    # -- one step -------------------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, keys: Sequence[int]) -> torch.Tensor:
        """logits [B, V] fp32 (left unchanged) -> [B] int64 token ids on the same device."""
        live = [self._live[k] for k in keys]
        adjusted = self._adjust(logits, keys, live)
        out = adjusted.argmax(-1)
        hot = [i for i, r in enumerate(live) if not r.params.greedy]
        for start in range(0, len(hot), FILTER_ROWS):
            self._draw(adjusted, out, hot[start : start + FILTER_ROWS], live)
        penalised = [i for i, k in enumerate(keys) if k in self.history]
        if penalised:
            rows = self.history.rows([keys[i] for i in penalised])
            self.history.record(rows, out[to_device(penalised, _I64, self.device)])
        for r in live:
            r.num_sampled += 1
        return out

    def _draw(self, adjusted: torch.Tensor, out: torch.Tensor, hot: list[int], live: list[_Live]) -> None:
        """Sample rows `hot` of `adjusted` into `out`."""
        hot_idx = to_device(hot, _I64, self.device)
        probs = self._filtered(adjusted[hot_idx], [live[i].params for i in hot]).softmax(-1)
        by_generator: dict[int, list[int]] = {}
        for j, i in enumerate(hot):
            by_generator.setdefault(id(live[i].generator), []).append(j)
        # An exponential race, argmax(p / E) with E ~ Exp(1), draws token i with probability p_i;
        # unlike torch.multinomial it has no validity checks that wait for the device.
        race = torch.empty_like(probs)
        for js in by_generator.values():
            rows = to_device(js, _I64, self.device)
            noise = torch.empty(len(js), probs.shape[1], device=self.device)
            race[rows] = noise.exponential_(generator=live[hot[js[0]]].generator)
        out[hot_idx] = (probs / race).argmax(-1)

    def distribution(self, logits: torch.Tensor, keys: Sequence[int]) -> torch.Tensor:
        """[B, V] probabilities the next sample() draws each row from (one-hot for greedy rows),
        without advancing any state: what the sampling tests compare against their reference."""
        live = [self._live[k] for k in keys]
        adjusted = self._adjust(logits, keys, live)
        probs = torch.nn.functional.one_hot(adjusted.argmax(-1), self.vocab_size).to(_F32)
        hot = [i for i, r in enumerate(live) if not r.params.greedy]
        if hot:
            idx = to_device(hot, _I64, self.device)
            probs[idx] = self._filtered(adjusted[idx], [live[i].params for i in hot]).softmax(-1)
        return probs

    def _adjust(self, logits: torch.Tensor, keys: Sequence[int], live: list[_Live]) -> torch.Tensor:
        """min_tokens, logit_bias and penalties: what greedy and sampled rows alike see."""
        masked: tuple[list[int], list[int]] = ([], [])
        bias: tuple[list[int], list[int], list[float]] = ([], [], [])
        for i, r in enumerate(live):
            p = r.params
            if r.num_sampled < p.min_tokens:
                for t in p.stop_token_ids + (() if p.ignore_eos else self.eos):
                    if t < self.vocab_size:
                        masked[0].append(i)
                        masked[1].append(t)
            for t, b in p.logit_bias:
                bias[0].append(i)
                bias[1].append(t)
                bias[2].append(b)
        penalised = [i for i, k in enumerate(keys) if k in self.history]
        if not (masked[0] or bias[0] or penalised):
            return logits
        x = logits.clone()
        dev = self.device
        if bias[0]:
            index = (to_device(bias[0], _I64, dev), to_device(bias[1], _I64, dev))
            x.index_put_(index, to_device(bias[2], _F32, dev), accumulate=True)
        if masked[0]:
            index = (to_device(masked[0], _I64, dev), to_device(masked[1], _I64, dev))
            x.index_put_(index, torch.full((len(masked[0]),), float("-inf"), device=dev))  # filled, not copied
        for start in range(0, len(penalised), FILTER_ROWS):
            group = penalised[start : start + FILTER_ROWS]
            idx = to_device(group, _I64, dev)
            rows = self.history.rows([keys[i] for i in group])
            ps = [live[i].params for i in group]
            x[idx] = apply_penalties(
                x[idx], self.history.output_counts[rows], self.history.in_prompt[rows],
                to_device([p.repetition_penalty for p in ps], _F32, dev),
                to_device([p.frequency_penalty for p in ps], _F32, dev),
                to_device([p.presence_penalty for p in ps], _F32, dev),
            )
        return x

    def _filtered(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Temperature, then min_p, then top-k and top-p, for sampled (non-greedy) rows."""
        dev, vocab = self.device, self.vocab_size
        x = logits / to_device([p.temperature for p in params], _F32, dev)[:, None]
        if any(p.min_p > 0 for p in params):
            x = apply_min_p(x, to_device([p.min_p for p in params], _F32, dev))
        if any(0 < p.top_k < vocab or p.top_p < 1 for p in params):
            top_k = to_device([p.top_k if 0 < p.top_k < vocab else vocab for p in params], _I64, dev)
            top_p = to_device([p.top_p if p.top_p < 1 else float("inf") for p in params], _F32, dev)
            x = top_k_top_p(x, top_k, top_p)
        return x
