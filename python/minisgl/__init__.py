"""minisgl: an LLM serving engine for Mixture-of-Experts models."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minisgl.version import __version__
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from minisgl.llm import LLM
    from minisgl.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m minisgl make-tiny-model` and light tools do not import the engine.
    if name == "LLM":
        from minisgl.llm import LLM

        return LLM
    if name == "SamplingParams":
        from minisgl.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
