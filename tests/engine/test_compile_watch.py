"""The compile watch names what made a kernel compile after warm-up: the arguments whose Triton
specialisation differs from the kernel's closest earlier variant (Triton's own repr of the hook
names none). Driven with the hook's keyword arguments as Triton 3.6 passes them: its key is the
kernel cache's, the text of the arguments' (type, spec) list followed by that of the launch options
(triton/runtime/jit.py, compute_cache_key); on an H100 Triton's own repr of a misaligned pointer's
compile read `add_one[...](x_ptr: ()`, the key's second character."""
from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace

import pytest

from minisgl.engine import compile_watch

PARAMS = ("x_ptr", "slot_ptr", "rows", "BLOCK")
OPTIONS = {"num_warps": 4, "num_stages": 3}


def hook_kwargs(specs: tuple, options: dict = OPTIONS) -> dict:
    fn = SimpleNamespace(name="_kernel", jit_function=SimpleNamespace(params=[SimpleNamespace(name=n) for n in PARAMS]))
    key = str(list(specs)) + str(options)
    return dict(key=key, repr=f"_kernel[...](x_ptr: {key[1]})", fn=fn, compile={"key": key})


ALIGNED = (("*bf16", "D"), ("*i64", "D"), ("i32", None), ("constexpr", 32))


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_watch, "_compiles", Counter())
    monkeypatch.setattr(compile_watch, "_variants", {})
    monkeypatch.setattr(compile_watch, "_previous_hook", None)
    monkeypatch.setattr(compile_watch, "_armed", False)
    monkeypatch.setattr(compile_watch, "_warming", 0)


def test_a_compile_after_warm_up_names_the_argument_that_changed(watch: None, caplog: pytest.LogCaptureFixture) -> None:
    with compile_watch.warming_up():
        compile_watch._on_compile(**hook_kwargs(ALIGNED))
        compile_watch._on_compile(**hook_kwargs(ALIGNED[:3] + (("constexpr", 64),)))
    assert not caplog.records
    misaligned = (ALIGNED[0], ("*i64", ""), *ALIGNED[2:])
    with caplog.at_level(logging.WARNING, logger=compile_watch.__name__):
        compile_watch._on_compile(**hook_kwargs(misaligned))
    (record,) = caplog.records
    assert "_kernel after warm-up" in record.getMessage()
    assert "slot_ptr ('*i64', 'D') -> ('*i64', '')" in record.getMessage()
    assert "x_ptr" not in record.getMessage() and "BLOCK" not in record.getMessage()
    assert compile_watch.compile_count() == 3


def test_options_alone_are_named_too(watch: None, caplog: pytest.LogCaptureFixture) -> None:
    with compile_watch.warming_up():
        compile_watch._on_compile(**hook_kwargs(ALIGNED))
    with caplog.at_level(logging.WARNING, logger=compile_watch.__name__):
        compile_watch._on_compile(**hook_kwargs(ALIGNED, {"num_warps": 8, "num_stages": 3}))
    assert ("options {'num_warps': 4, 'num_stages': 3} -> {'num_warps': 8, 'num_stages': 3}"
            in caplog.records[0].getMessage())


def test_a_key_of_another_form_falls_back_to_the_repr(watch: None, caplog: pytest.LogCaptureFixture) -> None:
    compile_watch._armed = True
    kwargs = hook_kwargs(ALIGNED[:2])  # fewer specialisations than parameters: not a form it knows
    with caplog.at_level(logging.WARNING, logger=compile_watch.__name__):
        compile_watch._on_compile(**kwargs)
    assert kwargs["repr"] in caplog.records[0].getMessage()


def test_constexpr_values_that_are_names_or_tuples_are_kept_as_written(watch: None) -> None:
    key = "[('*bf16', 'D'), ('*i64', 'D'), ('i32', None), ('constexpr', (fp16, [1, 2]))]{'num_warps': 4}"
    variant = compile_watch.specialisation(dict(hook_kwargs(ALIGNED), key=key))
    assert variant == {"x_ptr": "('*bf16', 'D')", "slot_ptr": "('*i64', 'D')", "rows": "('i32', None)",
                       "BLOCK": "('constexpr', (fp16, [1, 2]))", "options": "{'num_warps': 4}"}


@pytest.mark.parametrize("key", ["(('*bf16', 'D'),){}", "x[0]{}", "[('*bf16', 'D')"])
def test_keys_that_open_with_no_list_give_no_specialisation(watch: None, key: str) -> None:
    assert compile_watch.specialisation(dict(hook_kwargs(ALIGNED), key=key)) is None
