"""An input that several linear layers read (a mixer's input projections; the MoE block's router,
shared expert and routed experts): the tensor, and its FP8 quantisation, made by the first FP8 layer
that reads it and reused by the others, so each input is quantised once, not once per layer.

BF16 layers, and every layer on the CPU, read the tensor itself: there wrapping changes nothing.
Nothing is kept beyond the object, which lives for one forward: no host sync, no per-shape state,
so it is captured in CUDA graphs as any op is. It lives with the kernels that read it (which may not
import layers/) and imports no triton until it quantises, so CPU installs import it too.
"""
from __future__ import annotations

import torch


class Activations:
    __slots__ = ("x", "_fp8")

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self._fp8: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def of(x: torch.Tensor | Activations) -> Activations:
        return x if isinstance(x, Activations) else Activations(x)

    @staticmethod
    def quantised(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> Activations:
        """x with the codes and scales a kernel made with it (fp8's contract), so none are made again."""
        acts = Activations(x)
        acts._fp8 = (codes, scales)
        return acts

    def fp8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [M', K], group scales [M', ceil(K/128)] token-major) of x's [M, K] rows
        (kernels/fp8_quant.py). M' is M rounded up to cuBLAS's ROWS_MULTIPLE, whichever GEMM reads
        them: the codes of rows [:M] do not depend on the padding, and the other GEMMs read only those."""
        if self._fp8 is None:
            # Imported here: CPU installs have no triton (and never quantise).
            from minisgl.kernels.fp8_gemm_cublas import ROWS_MULTIPLE
            from minisgl.kernels.fp8_quant import quantize_activations

            self._fp8 = quantize_activations(self.x.reshape(-1, self.x.shape[-1]), ROWS_MULTIPLE)
        return self._fp8


def tensor(x: torch.Tensor | Activations) -> torch.Tensor:
    """The input as a tensor, for layers that do not quantise it."""
    return x.x if isinstance(x, Activations) else x
