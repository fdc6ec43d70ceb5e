"""Schemathesis hooks for tests/server/test_server_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

- Valid requests are kept cheap on the CPU and reach the engine: in positive cases n and max_tokens
  (/generate: sampling_params' n and max_new_tokens) are clamped (and max_tokens set where it was
  left to the room in the context), `model` is left out (the served model) and a chat role outside the ones the chat
  template knows becomes "user" (schemathesis re-checks a case after this hook, so a case is
  judged as what it became).
- positive_data_acceptance is replaced by a stricter reading of it: a schema-valid request may be
  refused (400) only for a limit an OpenAPI schema cannot state: the model's vocabulary and context
  length, a field the server does not implement, a cross-field rule, a server flag's limit, or a
  chat message the model's template cannot render. Any other refusal means the schema is wrong.
"""
from __future__ import annotations

import schemathesis

from minisgl.tokenizer.chat import ROLES

CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2}

RUNTIME_LIMITS = (
    "outside the vocabulary",  # token ids >= the model's vocabulary size
    "maximum context length",  # prompt + max_tokens > the context length
    "not supported by this server",  # accepted for compatibility, refused unless neutral
    "choices per request",  # prompts x n
    "needs logprobs",  # top_logprobs without logprobs
    "give exactly one of prompt and messages",  # /tokenize
    "chat_template_kwargs needs messages",
    "is offered twice",  # tool names: unique within a request
    "needs tools",  # a tool_choice other than "none" without tools
    "which is not among the tools",  # a named tool_choice must name one of the request's tools
    "need a server started with --tool-call-parser",  # tools, on a server without a tool parser
    "min_tokens must be in",  # min_tokens <= max_tokens (which before_call may have clamped)
    "--max-logprob-entries",  # prompt length x n x logprobs
    "does not fit in 64 bits",  # what the engine holds, derived values included (seed + choice index)
    "lone UTF-16 surrogate",  # JSON strings that are not Unicode text
    "role must be one of",  # chat roles and parts: what the chat template can render
    "only text parts",
    "function.arguments is not JSON",  # a tool call's arguments: a string that must hold a JSON object
    "function.arguments must be a JSON object",
    "the chat template rejected",
    "give exactly one of text and input_ids",  # /generate
    "entries for",  # /generate: a list of sampling_params, one per prompt
    "must ask for the same n",
    "max_new_tokens 0 only scores a prompt",  # needs return_logprob with logprob_start_len >= 0
)


@schemathesis.hook
def before_call(context, case, kwargs) -> None:  # noqa: ANN001 - schemathesis' hook signature
    meta = case.meta
    if not isinstance(case.body, dict) or meta is None or not meta.generation.mode.is_positive:
        return
    for key, cap in CAPS.items():
        v = case.body.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > cap:  # 84.0 is an integer too
            case.body[key] = cap
    if case.body.get("max_tokens") is None and case.body.get("max_completion_tokens") is None:
        case.body["max_tokens"] = CAPS["max_tokens"]  # absent or null: all the room left in the context
    case.body.pop("model", None)
    sampling = case.body.get("sampling_params")  # /generate's, one or one per prompt
    for sp in (sampling if isinstance(sampling, list) else [sampling]):
        if isinstance(sp, dict):
            sp["n"] = min(sp["n"], CAPS["n"]) if type(sp.get("n")) is int else sp.get("n", 1)
            if sp.get("max_new_tokens") is None or (type(sp["max_new_tokens"]) is int and sp["max_new_tokens"] > 4):
                sp["max_new_tokens"] = CAPS["max_tokens"]
    # Schemathesis' generator ignores propertyNames (its issue #3771), so logit_bias gets keys that
    # are not token ids; keep only the entries the schema allows.
    if isinstance(case.body.get("logit_bias"), dict):
        case.body["logit_bias"] = {k: v for k, v in case.body["logit_bias"].items()
                                   if k.isascii() and k.isdigit() and type(v) in (int, float)}
    messages = case.body.get("messages")
    for m in messages if isinstance(messages, list) else ():  # a route without messages may get any value
        if isinstance(m, dict) and m.get("role") not in ROLES:
            m["role"] = "user"


@schemathesis.check
def positive_data_refused_only_for_runtime_limits(ctx, response, case) -> None:  # noqa: ANN001
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return
    message = response.json()["error"]["message"]
    if not any(reason in message for reason in RUNTIME_LIMITS):
        raise AssertionError(f"a schema-valid request was refused for a reason the schema could state: {message}")
