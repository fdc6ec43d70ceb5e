"""A small OpenAI-compatible client for alignment: the served model's name, and /v1/completions
posts fanned out over a bounded number of concurrent requests, each with a timeout."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from minisgl.tools.align.wire import WireError, only_choice

T = TypeVar("T")
R = TypeVar("R")


def served_model(url: str, timeout_s: float) -> tuple[str, str | None]:
    """The first model a server lists, and its checkpoint path where the server says
    (/get_model_info: minisgl and SGLang; /v1/models' root: vLLM)."""
    try:
        card = httpx.get(url + "/v1/models", timeout=timeout_s).raise_for_status().json()["data"][0]
        info = httpx.get(url + "/get_model_info", timeout=timeout_s)
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise WireError(f"{url}/v1/models: cannot tell the served model ({e}); give its name") from e
    return card["id"], info.json()["model_path"] if info.status_code == 200 else card.get("root")


class CompletionsClient:
    def __init__(self, url: str, model: str | None, concurrency: int, timeout_s: float) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.url = url.rstrip("/")
        self.model, self.model_path = (model, None) if model else served_model(self.url, timeout_s)
        self.concurrency = concurrency
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The reply (with one choice); an HTTP error becomes a WireError with the server's message."""
        try:
            r = self.http.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise WireError(f"{self.url}/v1/completions: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise WireError(f"{self.url}/v1/completions answered {r.status_code}: {r.text[:500]}")
        reply = r.json()
        only_choice(reply)
        return reply

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """fn over items, at most `concurrency` at a time, results in order."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(fn, items))

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "model_path": self.model_path}

    def close(self) -> None:
        self.http.close()
