"""EngineArgs <-> argparse: one `--kebab-case` flag per EngineArgs field, so the flags never drift
from the dataclass."""
from __future__ import annotations

import argparse
import dataclasses
import typing

from minisgl.engine.args import EngineArgs

_HELP = {
    "model_path": "checkpoint directory (HF layout); default: the embedded tiny model",
    "context_length": "max tokens per request (prompt + output)",
    "num_pages": "KV pages to allocate (default: every slot can reach the context length)",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(EngineArgs)
    for f in dataclasses.fields(EngineArgs):
        hint = hints[f.name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), type=base, default=f.default, help=_HELP.get(f.name, f"default: {f.default}")
        )


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    return EngineArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineArgs)})
