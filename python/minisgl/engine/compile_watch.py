"""Counts Triton JIT compilations (and autotuning runs) in this process, so the server can show
that nothing compiles once it reports ready: a compile in the serving loop stalls every running
request for the seconds it takes.

Triton calls `knobs.runtime.jit_post_compile_hook` once per new kernel specialisation (a kernel
loaded from the on-disk cache counts too: it still costs a load, and shows an unseen shape).
Autotuners that meet a new key benchmark every config; those runs are counted by wrapping
`Autotuner.run`'s cache miss.
"""
from __future__ import annotations

import ast
import contextlib
import logging
import threading
from collections import Counter
from typing import Any, Iterator

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_compiles: Counter[str] = Counter()
_autotunes: Counter[str] = Counter()
_installed = False
_warming = 0  # nesting depth of warming_up()
_armed = False  # set once a warm-up has finished: compiles outside warm-ups are stalls from then on


_previous_hook: Any = None
# Per kernel, each compiled variant's arguments as Triton specialised them: {name: "(type, spec)"}, e.g.
# "('*i64', 'D')" for a pointer aligned to 16 bytes, "('i32', None)" for an int it does not specialise.
_variants: dict[str, list[dict[str, str]]] = {}


def _leading_list(text: str) -> tuple[list[str], str] | None:
    """The items of the list `text` opens with, each as its source text, and what follows the list;
    None where `text` does not open with a list Python can parse (items are parsed, not evaluated:
    a dtype's repr is a name)."""
    for end in (i for i, ch in enumerate(text) if ch == "]"):
        try:
            node = ast.parse(text[:end + 1], mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.List):
            return [ast.get_source_segment(text, item) or "" for item in node.elts], text[end + 1:]
        return None
    return None


def specialisation(kwargs: dict[str, Any]) -> dict[str, str] | None:
    """Each argument's specialisation, as text, from the hook's key; None where the key has another
    form. Triton 3.6 passes the kernel cache's key: the text of the per-argument (type, spec) list,
    then that of the launch options. (The hook's own `repr` pairs the parameters with the key's
    second character, so it names no argument.)"""
    key, fn = kwargs.get("key"), kwargs.get("fn")
    params = getattr(getattr(fn, "jit_function", None), "params", None)
    split = _leading_list(key) if isinstance(key, str) else None
    if split is None or not params or len(params) != len(split[0]):
        return None
    specs, options = split
    return {**{p.name: spec for p, spec in zip(params, specs)}, "options": options}  # a variant may differ only there


def new_in(variant: dict[str, str], earlier: list[dict[str, str]]) -> str:
    """What sets `variant` apart from the closest earlier variant of its kernel: the arguments whose
    specialisation differs, as `name old -> new`."""
    if not earlier:
        return "its first variant"
    closest = min(earlier, key=lambda e: sum(e.get(k) != v for k, v in variant.items()))
    return ", ".join(f"{k} {closest.get(k)} -> {v}" for k, v in variant.items() if closest.get(k) != v) or "none"


def _on_compile(**kwargs: Any) -> Any:
    name = getattr(kwargs["fn"], "name", kwargs["repr"])
    variant = specialisation(kwargs)
    with _lock:
        _compiles[name] += 1
        earlier = list(_variants.get(name, ()))
        if variant is not None:
            _variants.setdefault(name, []).append(variant)
    if _armed and not _warming:
        what = kwargs["repr"] if variant is None else f"arguments that differ from its closest earlier variant: " \
                                                        f"{new_in(variant, earlier)}"
        logger.warning("Triton compiled %s after warm-up; %s", name, what)
    return _previous_hook(**kwargs) if _previous_hook is not None else None


def _wrap_autotuner() -> None:
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.run

    def run(self: Autotuner, *args: Any, **kwargs: Any) -> Any:
        before = len(self.cache)
        out = original(self, *args, **kwargs)
        if len(self.cache) > before:
            name = self.base_fn.__name__
            with _lock:
                _autotunes[name] += 1
            if _armed and not _warming:
                logger.warning("Triton autotuned %s after warm-up", name)
        return out

    Autotuner.run = run


def install() -> bool:
    """Start counting (idempotent). False when Triton is not installed: nothing can compile then."""
    global _installed, _previous_hook
    if _installed:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    _previous_hook = knobs.runtime.jit_post_compile_hook  # chained: someone else's hook keeps working
    knobs.runtime.jit_post_compile_hook = _on_compile
    _wrap_autotuner()
    _installed = True
    return True


@contextlib.contextmanager
def warming_up() -> Iterator[None]:
    """Compiles inside are expected; after the first warm-up ends, every compile outside one is a
    stall worth a log line naming its kernel and signature."""
    global _warming, _armed
    _warming += 1
    try:
        yield
    finally:
        _warming -= 1
        _armed = True


def compile_count() -> int:
    """Compilations plus autotuning runs so far in this process."""
    with _lock:
        return sum(_compiles.values()) + sum(_autotunes.values())


def summary() -> dict[str, int]:
    with _lock:
        return {**{f"compile {k}": v for k, v in _compiles.items()}, **{f"autotune {k}": v for k, v in _autotunes.items()}}
