"""The training text of the embedded tiny model: Python source and docstrings from files of the
standard library that are byte-identical in CPython 3.10.13, 3.11.7 (and Debian's 3.11.2), 3.12.1
and 3.13.0, so every machine has the same corpus without downloading anything. (tkinter and
turtledemo are left out: Debian ships them in separate packages.)"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

TRAIN_FILES = (
    "_markupbase.py", "_py_abc.py", "_sitebuiltins.py", "_threading_local.py",
    "asyncio/protocols.py", "asyncio/windows_utils.py", "curses/__init__.py", "difflib.py",
    "email/_encoded_words.py", "importlib/metadata/_functools.py", "json/__init__.py", "json/scanner.py",
    "multiprocessing/dummy/__init__.py", "multiprocessing/heap.py", "multiprocessing/popen_forkserver.py",
    "multiprocessing/popen_spawn_posix.py", "multiprocessing/reduction.py", "multiprocessing/sharedctypes.py",
    "nturl2path.py", "optparse.py", "pyclbr.py", "tracemalloc.py", "unittest/_log.py", "unittest/signals.py",
    "unittest/util.py", "urllib/response.py", "xml/dom/__init__.py", "xml/dom/domreg.py",
    "xml/dom/minicompat.py", "xml/dom/xmlbuilder.py", "xml/sax/handler.py", "xml/sax/saxutils.py",
)
HELDOUT_FILES = ("_compression.py", "unittest/suite.py", "urllib/robotparser.py", "wsgiref/headers.py")
# SHA-256 of the files' bytes, concatenated in the order TRAIN_FILES + HELDOUT_FILES (384,432 bytes).
DIGEST = "aa98560a645971bd64c9afd86b2cb18376793b153cda909a526799279382a474"


@dataclass(frozen=True)
class Corpus:
    train: tuple[str, ...]  # one text per file
    heldout: tuple[str, ...]


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def load_corpus(root: str | None = None) -> Corpus:
    """The pinned files under `root` (this Python's standard library by default), checked against DIGEST."""
    root = root or stdlib_dir()
    h = hashlib.sha256()
    texts: list[str] = []
    for rel in TRAIN_FILES + HELDOUT_FILES:
        path = os.path.join(root, rel)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ValueError(f"the tiny model's corpus file {path} cannot be read: {e}") from e
        h.update(raw)
        texts.append(raw.decode("utf-8"))
    if h.hexdigest() != DIGEST:
        raise ValueError(
            f"the corpus files under {root} differ from the pinned ones (sha256 {h.hexdigest()}, expected "
            f"{DIGEST}); the tiny model is reproducible only from a CPython 3.10-3.13 standard library")
    return Corpus(train=tuple(texts[: len(TRAIN_FILES)]), heldout=tuple(texts[len(TRAIN_FILES):]))
