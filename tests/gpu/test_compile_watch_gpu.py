"""The compile watch against Triton's real hook: a kernel compiled after warm-up because a pointer
lost its 16-byte alignment is logged with that argument named (engine/compile_watch.py parses the
hook's key, whose form is Triton's to change)."""
from __future__ import annotations

import logging

import pytest
import torch

from minisgl.engine import compile_watch

pytestmark = pytest.mark.gpu
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _add_one(x_ptr, n):
    offs = tl.arange(0, 16)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def test_a_misaligned_pointer_is_named(caplog: pytest.LogCaptureFixture) -> None:
    assert compile_watch.install()
    x = torch.randint(0, 100, (64,), dtype=torch.int64, device="cuda")
    with compile_watch.warming_up():
        _add_one[(1,)](x, 16)
    with caplog.at_level(logging.WARNING, logger=compile_watch.__name__):
        _add_one[(1,)](x[1:], 16)  # 8 bytes past an aligned base: no longer divisible by 16
        torch.cuda.synchronize()
    messages = [r.getMessage() for r in caplog.records if "_add_one" in r.getMessage()]
    assert len(messages) == 1, messages
    named = messages[0].split("closest earlier variant: ")[-1]
    assert named.startswith("x_ptr (") and ", n (" not in named, messages[0]  # the pointer alone
