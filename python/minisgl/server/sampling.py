"""A request body's sampling fields -> SamplingParams: what the request sets, else the checkpoint's
generation_config defaults, else the API's own defaults."""
from __future__ import annotations

from typing import Any

from minisgl.sampling_defaults import SamplingDefaults
from minisgl.sampling_params import SamplingParams
from minisgl.server.openai_types import SamplingFields

# Request fields the checkpoint's generation_config may default (SamplingParams names).
DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def _value(body: SamplingFields, defaults: SamplingDefaults, name: str) -> Any:
    return getattr(body, name) if name in body.model_fields_set else defaults.get(name, getattr(body, name))


def requested_max_tokens(body: SamplingFields, defaults: SamplingDefaults) -> int | None:
    """max_completion_tokens (chat's newer name) or max_tokens as the request sets them, else the
    generation_config's max_new_tokens, else the endpoint's default (None: all the room left)."""
    for name in ("max_completion_tokens", "max_tokens"):
        if name in body.model_fields_set and getattr(body, name) is not None:
            return getattr(body, name)
    return defaults.get("max_tokens", getattr(body, "max_tokens", None))


def request_sampling_params(
    body: SamplingFields, defaults: SamplingDefaults, vocab_size: int, max_tokens: int, logprobs: int | None,
    prompt_logprobs: int | None, j: int,
) -> SamplingParams:
    """Raises ValueError (with the field named) for values the engine cannot take."""
    fields = {name: _value(body, defaults, name) for name in DEFAULTABLE}
    if fields["top_k"] == 0:  # 0 and -1 both mean off, as in vLLM
        fields["top_k"] = -1
    params = SamplingParams(
        **fields,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        stop=body.stop or (),
        stop_token_ids=body.stop_token_ids or (),
        ignore_eos=body.ignore_eos,
        seed=body.seed,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=body.skip_special_tokens,
        logit_bias=body.logit_bias or (),
    )
    params.check_vocab(vocab_size)
    return params.for_choice(j)
