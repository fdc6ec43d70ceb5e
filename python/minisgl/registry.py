"""A name -> backend map per backend family, importing each backend only when it is chosen.

Lazy import keeps GPU-only modules (triton, fla) out of CPU processes that never select them.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry:
    module: str
    attr: str


class Registry(Generic[T]):
    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, target: str) -> None:
        """Register `name` -> "package.module:attr"."""
        module, _, attr = target.partition(":")
        if not attr:
            raise ValueError(f"{self.family} backend target must be 'module:attr', got {target!r}")
        if name in self._entries:
            raise ValueError(f"{self.family} backend {name!r} is registered twice")
        self._entries[name] = _Entry(module, attr)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def check(self, name: str) -> None:
        """ValueError naming the choices when no backend is registered as `name` (nothing is imported)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.family} backend {name!r}; choose one of {', '.join(self.names())}")

    def get(self, name: str) -> Any:
        self.check(name)
        entry = self._entries[name]
        return getattr(importlib.import_module(entry.module), entry.attr)
