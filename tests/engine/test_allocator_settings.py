"""engine/allocator_settings.py: expandable segments by default, the user's own setting kept."""
from __future__ import annotations

import pytest
import torch

from minisgl.engine import allocator_settings


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The settings handed to the allocator, recorded instead of applied (this machine has no CUDA)."""
    seen: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", seen.append, raising=False)
    for name in allocator_settings.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return seen


def test_without_a_user_setting_the_engine_turns_them_on(calls: list[str]) -> None:
    assert allocator_settings.prefer_expandable_segments() is True
    assert calls == ["expandable_segments:True"]


def test_other_allocator_settings_are_not_a_choice_about_segments(calls: list[str], monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert allocator_settings.prefer_expandable_segments() is True
    assert calls == ["expandable_segments:True"]


@pytest.mark.parametrize("name", allocator_settings.ENV_NAMES)
@pytest.mark.parametrize("value, on", [("expandable_segments:False", False),
                                       ("max_split_size_mb:512,expandable_segments:True", True)])
def test_the_users_setting_wins(calls: list[str], monkeypatch, name: str, value: str, on: bool) -> None:
    monkeypatch.setenv(name, value)
    assert allocator_settings.prefer_expandable_segments() is on
    assert calls == [], "the user's choice is left to torch, which read it from the environment"
