"""Every repository path that README.md, scripts/README.md and docs/ name exists.

A path is a `code span` or a link target with a '/' in it and nothing but path characters, or a
word in a fenced block that starts with a top-level directory of the repo. It may be written from
the repo root, from the package (`models/config.py` means python/minisgl/models/config.py) or
from the document's own directory; it names the repository when its first part is found there.
Not repository paths: placeholders (`<...>`, `$VAR`, an all-caps part such as RUN_DIR), URLs,
absolute paths, and run outputs under reports/ (git-ignored).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python/minisgl"
TOP_DIRS = ("python/", "scripts/", "docs/", "tests/", "benchmarks/")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_./\-]*/[A-Za-z0-9_./\-]*$")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_\-]+$")


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "scripts/README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _named_paths(text: str) -> set[str]:
    fenced = "\n".join(FENCE.findall(text))
    prose = FENCE.sub("", text)
    spans = re.findall(r"`([^`\n]+)`", prose) + re.findall(r"\]\(([^)#\s]+)", prose)
    words = [w for w in re.split(r"[\s\"'=()|]+", fenced) if w.startswith(TOP_DIRS)]
    return {p.rstrip(".,:;") for p in spans + words if PATHLIKE.match(p.rstrip(".,:;"))}


def _missing(path: str, doc: Path) -> bool:
    parts = path.split("/")
    if parts[0] == "reports" or any(PLACEHOLDER.match(p) for p in parts):
        return False
    bases = [base for base in (ROOT, PACKAGE, doc.parent) if (base / parts[0]).exists()]
    return bool(bases) and not any((base / path).exists() for base in bases)


def test_documents_name_only_existing_paths() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {p}" for doc in _documents() for p in sorted(_named_paths(doc.read_text()))
               if _missing(p, doc)]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_check_sees_paths() -> None:
    found = _named_paths("`scripts/lib/common.sh`, [x](docs/afd.md), `$RUN_DIR/a.json`, `<dir>/x`, "
                         "`http://h/v1`\n```\nMODEL_PATH=/m scripts/validate/x.sh --out reports/x\n```\n")
    assert found == {"scripts/lib/common.sh", "docs/afd.md", "scripts/validate/x.sh"}
    doc = ROOT / "README.md"
    assert _missing("scripts/validate/no_such.sh", doc) and _missing("models/no_such.py", doc)
    assert not _missing("models/config.py", doc) and not _missing("RUN_DIR/sample.json", doc)
