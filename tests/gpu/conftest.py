"""Fixtures of the GPU tests (tests/conftest.py skips them without CUDA)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def quantiser_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The activation quantiser (kernels/fp8_quant.py), counting its calls (each call's row count)."""
    fp8_quant = pytest.importorskip("minisgl.kernels.fp8_quant")
    calls: list[int] = []
    real = fp8_quant.quantize_activations

    def counted(x: torch.Tensor, rows_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(x.shape[0])
        return real(x, rows_multiple)

    monkeypatch.setattr(fp8_quant, "quantize_activations", counted)
    return calls
