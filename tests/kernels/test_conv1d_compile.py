"""The conv1d kernels, plain and writing PlanarOut's column blocks, through Triton's whole compiler
for sm_90 (to PTX) on the CPU, without a GPU: the interpreter (tests/gpu/test_conv1d_kernels.py
under TRITON_INTERPRET=1) skips the code generator. The planar prefill's output stores must stay
as wide as the plain ones (the blocks' offsets keep the columns' contiguity and alignment), and so
must those of a prefill whose rows come from a map (a token block's one row offset)."""
from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 replaces the compiler with the interpreter: run without it",
                allow_module_level=True)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from minisgl.kernels.conv1d import _conv1d_prefill_kernel, _conv1d_update_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
# What Triton specialises at launch on the model's tensors: 16-aligned pointers, strides and sizes.
ALIGNED = ("stride_x", "stride_w", "stride_out", "channels", "split1", "split2")


def _ptx(kernel, constexprs: dict[str, object]) -> str:
    names = [p.name for p in kernel.params]
    pointer_types = dict(slot_ptr="i64", cu_ptr="i32", row_ptr="i32")
    signature = {p.name: "constexpr" if p.is_constexpr else "*" + pointer_types.get(p.name, "bf16")
                 if p.name.endswith("_ptr") else "i32" for p in kernel.params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr") or n in ALIGNED}
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=TARGET).asm["ptx"]


def _stores(ptx: str) -> list[str]:
    return sorted(re.findall(r"st\.global[\.\w]*", ptx))


@pytest.mark.parametrize("width", [2, 4])
def test_prefill_compiles_with_planar_stores_as_wide_as_plain(width: int) -> None:
    tiles = dict(KERNEL_WIDTH=width, BLOCK_T=32, BLOCK_C=512)  # conv1d_prefill's tiling at 122B's channels
    plain = _stores(_ptx(_conv1d_prefill_kernel, tiles | dict(PLANAR=False, ROW_MAP=False, NORM_HEAD=0)))
    planar = _stores(_ptx(_conv1d_prefill_kernel, tiles | dict(PLANAR=True, ROW_MAP=False, NORM_HEAD=0)))
    mapped = _stores(_ptx(_conv1d_prefill_kernel, tiles | dict(PLANAR=True, ROW_MAP=True, NORM_HEAD=0)))
    normed = _stores(_ptx(_conv1d_prefill_kernel, tiles | dict(PLANAR=True, ROW_MAP=True, NORM_HEAD=128)))
    assert "st.global.v2.b32" in plain  # 8-byte stores: 4 of 512 channels a thread at 4 warps
    assert planar == plain
    assert mapped == plain
    assert normed == plain  # the heads' norm (fla's prefill) keeps the stores as they are


@pytest.mark.parametrize("planar", [False, True])
def test_update_compiles(planar: bool) -> None:
    assert _stores(_ptx(_conv1d_update_kernel, dict(KERNEL_WIDTH=4, BLOCK_C=256, PLANAR=planar)))
