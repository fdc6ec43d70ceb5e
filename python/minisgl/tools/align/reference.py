"""References: what scores the candidate's tokens, teacher-forced. Any server that returns vLLM's
prompt_logprobs (here), or HF transformers in this process (align_hf.py)."""
from __future__ import annotations

from typing import Any, Protocol

from minisgl.tools.align.candidate import Sample
from minisgl.tools.align.http import CompletionsClient
from minisgl.tools.align.metrics import TokenScore
from minisgl.tools.align.wire import (
    NO_TOKEN_IDS,
    WireError,
    only_choice,
    prompt_scores,
    score_body,
)


class Reference(Protocol):
    def score(self, samples: list[Sample]) -> list[list[TokenScore]]:
        """Per sample, the reference's view of each completion token."""

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def teacher_forced(s: Sample) -> tuple[list[int], int]:
    """The prompt with the completion appended, and where the completion starts."""
    if s.completion_token_ids is None:
        raise WireError(NO_TOKEN_IDS)
    return list(s.prompt_token_ids) + list(s.completion_token_ids), len(s.prompt_token_ids)


class ServerReference:
    def __init__(self, client: CompletionsClient) -> None:
        self.client = client

    def _one(self, s: Sample) -> list[TokenScore]:
        seq, start = teacher_forced(s)
        return prompt_scores(only_choice(self.client.complete(score_body(self.client.model, seq))), seq, start)

    def score(self, samples: list[Sample]) -> list[list[TokenScore]]:
        return self.client.map(self._one, samples)

    def describe(self) -> dict[str, Any]:
        return {"kind": "server", **self.client.describe()}

    def close(self) -> None:
        self.client.close()
