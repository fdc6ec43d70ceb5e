"""The package's rooms import only downward, and no module imports itself back round a cycle.

Every `import minisgl...` and `from minisgl... import ...` in python/minisgl counts, wherever it
stands: at the top of a module, inside a function (a lazy import is still a dependency) or under
TYPE_CHECKING (a type names the room it comes from). Backends that a Registry imports by name
are not imports and do not count.

A module's room is its subpackage (minisgl/engine/plan.py is in `engine`) or, for a module at the
package root, its own name (minisgl/llm.py is `llm`). The rooms, top to bottom: a room may import
from its own room and from any room on a lower line, never from one on its own line or above.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "minisgl"

LEVELS: tuple[tuple[str, ...], ...] = (
    ("minisgl", "__main__"),  # the package's front door (LLM, SamplingParams) and `python -m minisgl`
    ("bench",),  # benchmark clients: drive a server or the offline LLM
    ("server", "llm"),  # the HTTP server's processes; the offline API
    ("tools",),  # align, pipeline, preset: programs beside the server
    ("scheduler_factory", "startup_checks"),  # flags -> a scheduler; start-up mistakes found before loading
    ("tokenizer",),  # tokenize, detokenize (its stop-string search is the scheduler's)
    ("afd",),  # the coordinator is a scheduler built from scheduler/'s rules; workers run engine parts
    ("scheduler",),  # requests, admission, batching, the overlap loop
    ("engine",),  # the resolved plan, the model on a device, its pool, graphs, sampling
    ("models",),  # configs, the one model definition, weights, the tiny default model
    ("attention", "gdn", "moe"),  # backend families, each behind its Registry
    ("layers", "kvcache"),  # model building blocks; the pools and their planner
    ("parallel", "kernels"),  # collectives and shards; Triton kernels
    ("forward_batch", "registry", "sampling_defaults", "file_digest"),  # leaves every room may read
    ("arg_field", "process_setup"),  # flag metadata; process names, log level, loading bars
    ("prefill_budget",),  # a step's prompt tokens, one request's within a GDN group's bound
    ("host_copy", "sampling_params", "version", "prefill_groups"),
)
LEVEL = {room: i for i, rooms in enumerate(LEVELS) for room in rooms}


def module_name(path: Path) -> str:
    parts = ("minisgl", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "minisgl"
    return parts[1]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The minisgl modules `path` imports; `from pkg import name` counts as pkg.name when that is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "minisgl"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "minisgl":
            assert node.level == 0, f"{path}: relative import"
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or {node.module}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    edges = {m: imports(p, known) for m, p in mods.items()}
    for m, targets in edges.items():
        unknown = targets - known
        assert not unknown, f"{m} imports modules that do not exist: {sorted(unknown)}"
    return edges


def climbs(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for m, targets in edges.items():
        for t in sorted(targets):
            a, b = room(m), room(t)
            if a != b and LEVEL[b] <= LEVEL[a]:
                out.append(f"{m} ({a}, line {LEVEL[a]}) imports {t} ({b}, line {LEVEL[b]})")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_room_has_a_line() -> None:
    rooms = {room(m) for m in modules()}
    assert rooms <= set(LEVEL), f"rooms missing from LEVELS: {sorted(rooms - set(LEVEL))}"
    assert set(LEVEL) <= rooms, f"LEVELS names rooms that do not exist: {sorted(set(LEVEL) - rooms)}"


def test_rooms_import_only_downward() -> None:
    bad = climbs(graph())
    assert not bad, "imports from a room on the same line or above:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_can_fail() -> None:
    edges = {"minisgl.engine.a": {"minisgl.afd.b"}, "minisgl.afd.b": {"minisgl.engine.a"},
             "minisgl.kernels.c": {"minisgl.kernels.c"}, "minisgl.server.d": {"minisgl.llm"}}
    assert climbs(edges) == ["minisgl.engine.a (engine, line 8) imports minisgl.afd.b (afd, line 6)",
                             "minisgl.server.d (server, line 2) imports minisgl.llm (llm, line 2)"]
    assert cycles(edges) == [["minisgl.afd.b", "minisgl.engine.a"], ["minisgl.kernels.c"]]
    assert room("minisgl") == "minisgl" and room("minisgl.llm") == "llm" and room("minisgl.engine.plan") == "engine"
