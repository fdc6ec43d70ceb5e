"""The device flag kernels (kernels/device_flags.py) compile for sm_90 through Triton's whole
pipeline down to the cubin, on the CPU, and the PTX holds the memory operations the transport's
correctness rests on: the sender's release atomic at system scope, the receiver's volatile polling
(a plain load may be hoisted out of the loop) and its acquire after the spin (an unused atomic add
of 0 is dropped by the compiler), and the %globaltimer deadline that keeps a wait from hanging."""
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

from minisgl.kernels.device_flags import signal_kernel, wait_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def _ptx(kernel, signature: dict[str, str]) -> str:
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs={}), target=TARGET,
                              options={"num_warps": 1})
    assert compiled.asm["cubin"], "ptxas produced no cubin"
    return "\n".join(line.split("//")[0] for line in compiled.asm["ptx"].splitlines())


def test_signal_is_a_release_atomic_at_system_scope() -> None:
    ptx = _ptx(signal_kernel, {"flag_ptr": "*i32"})
    assert re.search(r"atom\.global\.sys\.release\.add", ptx), ptx


@pytest.mark.parametrize("timeout_type", ["i32", "i64"])  # Triton types a Python int by its value
def test_wait_polls_volatile_then_acquires_within_a_deadline(timeout_type: str) -> None:
    ptx = _ptx(wait_kernel, {"flag_ptr": "*i32", "count_ptr": "*i32", "error_ptr": "*i32", "channel": "i32",
                             "timeout_ns": timeout_type})
    loop = ptx[ptx.index("$L__BB0_1:"):]  # the spin loop's body onwards
    assert re.search(r"ld\.volatile\.global\.b32", loop), "the spin must re-load the flag every iteration"
    assert "%globaltimer" in loop, "the spin must be bounded by the clock"
    assert re.search(r"ld\.global\.sys\.acquire\.b32|atom\.global\.sys\.acquire", loop), "no acquire after the spin"
    # The timeout writes the channel into the error word: a store after the acquire.
    assert re.search(r"st\.global\.b32", loop[loop.index("acquire"):]), loop
