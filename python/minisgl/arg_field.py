"""Dataclass fields that carry their command-line help, choices and other engines' names for the
same flag, so a config's fields, its `--flags`, their `--help` and the allowed values are
declared once (server/cli_args.py turns them into argparse flags)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field, fields
from typing import Any


def arg(default: Any, help: str, choices: Sequence[str] | None = None, aliases: Sequence[str] = (),
        negations: Sequence[str] = ()) -> Any:
    """A field with a default; `help` says what it does (argparse adds the default), `choices`
    lists the accepted values, `aliases` are extra flag spellings (e.g. vLLM's name); for a bool,
    `negations` are flags that set it False (SGLang's --disable-radix-cache for vLLM's
    --enable-prefix-caching)."""
    if not help.strip():
        raise ValueError("every flag needs a description")
    meta = {"help": help, "choices": tuple(choices) if choices is not None else None, "aliases": tuple(aliases),
            "negations": tuple(negations)}
    return field(default=default, metadata=meta)


def check_choices(config: Any) -> None:
    """Raise ValueError, naming the flag and what it accepts, for a field set to a value outside its
    declared choices (None means unset and is always allowed)."""
    for f in fields(config):
        value, choices = getattr(config, f.name), f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            flag = "--" + f.name.replace("_", "-")
            raise ValueError(f"{flag} {value!r} is not one of {', '.join(choices)}")
