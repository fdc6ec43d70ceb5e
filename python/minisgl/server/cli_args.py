"""Dataclass <-> argparse: one `--kebab-case` flag per field of EngineArgs, SchedulerArgs, ServerArgs
and AfdArgs, with the help, choices and aliases each field declares (minisgl.arg_field), so the
flags and their --help never drift from the dataclasses."""
from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Collection
from typing import TypeVar

from minisgl.engine.args import EngineArgs

T = TypeVar("T")


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls: type, prefix: str = "", only: Collection[str] | None = None
) -> None:
    """--{prefix}{field} for each field (prefix "afd_" gives --afd-attn-workers); `only`: these fields."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        hint = hints[f.name]
        base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        flags = ("--" + (prefix + f.name).replace("_", "-"), *f.metadata["aliases"])
        dest, help_text = prefix + f.name, f.metadata["help"]
        if base is bool:  # --flag / --no-flag: type=bool would read "false" as True; argparse adds the default
            parser.add_argument(*flags, dest=dest, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
            if f.metadata["negations"]:
                parser.add_argument(*f.metadata["negations"], dest=dest, action="store_false",
                                    help=f"the same as --no-{flags[0][2:]}")
            continue
        if f.default is not None:
            help_text += " (default: %(default)s)"
        parser.add_argument(*flags, dest=dest, type=base, default=f.default, choices=f.metadata["choices"],
                            help=help_text)


def dataclass_from(ns: argparse.Namespace, cls: type[T], prefix: str = "") -> T:
    return cls(**{f.name: getattr(ns, prefix + f.name) for f in dataclasses.fields(cls)})


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, EngineArgs)


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    return dataclass_from(ns, EngineArgs)
