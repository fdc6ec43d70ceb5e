"""Every grouped expert GEMM specialisation moe_gemm.REGIMES can launch goes through Triton's real
front end (Python AST -> TTIR, for sm_90), on the CPU, without a GPU or a driver.

The interpreter (TRITON_INTERPRET=1, tests/kernels/test_moe_interpret.py) runs the kernels as
Python and skips the code generator's checks: a @jit helper whose constexpr branches return tiles
of different shapes ran there and failed to compile on the H200. Here each decode tile (block_n 64
and the narrowed one) and each large-M tile, FP8 and both plain dtypes, K a multiple of 128 or not,
must compile. TTIR only: the rest of the pipeline (layouts, PTX, ptxas) takes ~2 s a kernel.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1 replaces the compiler with the interpreter: run without it",
                allow_module_level=True)

from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402

from minisgl.kernels import moe_align  # noqa: E402
from minisgl.kernels.fp8_quant import GROUP  # noqa: E402
from minisgl.kernels.moe_blocks import MoeTile  # noqa: E402
from minisgl.kernels.moe_gemm import (  # noqa: E402
    NARROW_BLOCK_N, REGIMES, _moe_combine_kernel, _moe_down_kernel, _moe_gate_up_kernel,
)
from minisgl.kernels.moe_gemm_large import (  # noqa: E402
    _moe_down_large_kernel, _moe_gate_up_large_kernel, fuses_quantisation,
)

TARGET = GPUTarget("cuda", 90, 32)
# (weights and activations, their scales): FP8 codes with fp32 scales on bf16 models; the plain
# dtypes pass the tensor itself as its unread scale.
OPERANDS = {"fp8": ("fp8e4nv", "fp32"), "bf16": ("bf16", "bf16"), "fp32": ("fp32", "fp32")}


def _tiles() -> list[tuple[int, str, MoeTile]]:
    """(rows per block, "gate_up" or "down", tile) for every tile REGIMES can launch."""
    out = set()
    for r in REGIMES.values():
        for name, tile in (("gate_up", r.gate_up), ("down", r.down)):
            out.add((r.block_m, name, tile))
            if not tile.large_m:
                out.add((r.block_m, name, replace(tile, block_n=NARROW_BLOCK_N)))  # as moe_gemm._tile narrows
    return sorted(out, key=repr)


def _pointers(name: str, dtype: str, quant_h: bool) -> dict[str, str]:
    """Each pointer argument's element type; the grouping's and the routing weights' are the same everywhere."""
    w, s = OPERANDS[dtype]
    act = "bf16" if dtype == "fp8" else w  # FP8 weights run on bf16 models
    ptrs = dict(w_ptr=w, s_ptr=s, rows_ptr="i32", block_expert_ptr="i32", block_rows_ptr="i32")
    if name == "gate_up":
        h, hs = ("fp8e4nv", "fp32") if quant_h else (act, act)
        return ptrs | dict(x_ptr=w, xs_ptr=s, h_ptr=h, hs_ptr=hs)
    return ptrs | dict(h_ptr=w, hs_ptr=s, y_ptr=act, p_ptr="fp32")


def _compile_to_ttir(kernel, pointers: dict[str, str], constexprs: dict[str, object]) -> str:
    signature = {
        p.name: "constexpr" if p.is_constexpr else "*" + pointers[p.name] if p.name.endswith("_ptr") else "i32"
        for p in kernel.params
    }
    backend = make_backend(TARGET)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src = ASTSource(kernel, signature, constexprs)
    return str(src.make_ir(TARGET, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                           context))


CASES = [
    pytest.param(block_m, name, tile, dtype, even_k, quant_h,
                 id=f"{name}-m{block_m}-n{tile.block_n}-{'large' if tile.large_m else 'decode'}-{dtype}"
                    f"-{'even' if even_k else 'ragged'}K{'-quant_h' if quant_h else ''}")
    for (block_m, name, tile), dtype, even_k in itertools.product(_tiles(), OPERANDS, [True, False])
    for quant_h in [name == "gate_up" and fuses_quantisation(tile, dtype == "fp8", torch.bfloat16)]
]


@pytest.mark.parametrize("block_m,name,tile,dtype,even_k,quant_h", CASES)
def test_kernel_compiles(block_m: int, name: str, tile: MoeTile, dtype: str, even_k: bool, quant_h: bool) -> None:
    fp8 = dtype == "fp8"
    shape = dict(FP8=fp8, BLOCK_M=block_m, BLOCK_N=tile.block_n, BLOCK_K=GROUP, EVEN_K=even_k)
    if tile.large_m:
        shape["GROUP_M"] = tile.group_m
        kernel = _moe_gate_up_large_kernel if name == "gate_up" else _moe_down_large_kernel
    else:
        kernel = _moe_gate_up_kernel if name == "gate_up" else _moe_down_kernel
    if name == "gate_up":
        shape["UP_SCALE_ROW"] = 3
        if tile.large_m:
            shape["QUANT_H"] = quant_h
    ttir = _compile_to_ttir(kernel, _pointers(name, dtype, quant_h), shape)
    assert "tt.dot" in ttir and "tt.store" in ttir


@pytest.mark.parametrize("act,scale,shared", [("bf16", "bf16", False), ("fp32", "fp32", False), ("bf16", "bf16", True),
                                              ("fp32", "fp32", True), ("bf16", "fp32", True)])
def test_combine_compiles(act: str, scale: str, shared: bool) -> None:
    """The combine, alone and with the gated shared expert (the output in torch's promoted dtype)."""
    out = "fp32" if shared and scale == "fp32" else act
    pointers = dict(y_ptr=act, ids_ptr="i64", shared_ptr=act, scale_ptr=scale, out_ptr=out)
    ttir = _compile_to_ttir(_moe_combine_kernel, pointers, dict(TOP_K=8, BLOCK_N=1024, SHARED=shared))
    assert "tt.store" in ttir


@pytest.mark.parametrize("e_p2", [8, 256, 2048])
@pytest.mark.parametrize("block_m", sorted({r.block_m for r in REGIMES.values()}))
def test_align_split_kernels_compile(e_p2: int, block_m: int) -> None:
    """The prefill grouping's three kernels (sorts, histograms, gathers and a static binary search),
    at few, the real and many experts: a constexpr the interpreter let a loop reassign failed here."""
    pointers = dict(ids_ptr="i64", work_ptr="i32", block_expert_ptr="i32", block_rows_ptr="i32", rows_ptr="i32")
    sizes = dict(CHUNK=moe_align.CHUNK, E_P2=e_p2)
    bases = sizes | dict(BLOCK_M=block_m, TILE_C=max(1, moe_align.TILE_ELEMS // e_p2), TILE_B=moe_align.TILE_B)
    for kernel, constexprs in ((moe_align._moe_sort_kernel, sizes), (moe_align._moe_bases_kernel, bases),
                               (moe_align._moe_place_kernel, sizes)):
        assert "tt.store" in _compile_to_ttir(kernel, pointers, constexprs)
