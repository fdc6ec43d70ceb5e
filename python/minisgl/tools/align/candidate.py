"""The candidate: the server whose greedy completions are under test (minisgl colocated or AFD,
vLLM, SGLang: anything that speaks /v1/completions; scoring needs it to return token ids)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from minisgl.tools.align.http import CompletionsClient
from minisgl.tools.align.prompt_pool import Prompt
from minisgl.tools.align.wire import (
    completion_ids,
    completion_tokens,
    only_choice,
    sample_body,
)


@dataclass(frozen=True)
class Sample:
    id: int
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...] | None  # None: the server did not return them
    num_tokens: int
    text: str
    finish_reason: str | None

    def to_json(self) -> dict[str, Any]:
        ids = self.completion_token_ids
        return {**dataclasses.asdict(self), "prompt_token_ids": list(self.prompt_token_ids),
                "completion_token_ids": None if ids is None else list(ids)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Sample:
        ids = d["completion_token_ids"]
        return Sample(int(d["id"]), tuple(d["prompt_token_ids"]), None if ids is None else tuple(ids),
                      int(d["num_tokens"]), d["text"], d["finish_reason"])


class ServerCandidate:
    def __init__(self, client: CompletionsClient) -> None:
        self.client = client

    def _one(self, p: Prompt, max_new_tokens: int) -> Sample:
        reply = self.client.complete(sample_body(self.client.model, p.token_ids, max_new_tokens))
        choice = only_choice(reply)
        ids = completion_ids(choice)
        n = completion_tokens(reply) if ids is None else len(ids)
        return Sample(p.id, p.token_ids, None if ids is None else tuple(ids), n, choice.get("text", ""),
                      choice.get("finish_reason"))

    def generate(self, prompts: list[Prompt], max_new_tokens: int) -> list[Sample]:
        return self.client.map(lambda p: self._one(p, max_new_tokens), prompts)

    def describe(self) -> dict[str, Any]:
        return {"kind": "server", **self.client.describe()}

    def close(self) -> None:
        self.client.close()
