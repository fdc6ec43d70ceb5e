"""Tool-call argument values, written by the model as text, typed back by the tool's JSON schema.

The Qwen3.5 format writes strings and scalars as plain text and objects and arrays as JSON, so
"3" is an integer where the schema says integer and the string "3" where it says string. A value
that does not read as any type its schema allows stays the string the model wrote.
"""
from __future__ import annotations

import json
import re
from typing import Any

_INTEGER = re.compile(r"-?\d+")


def _schema_types(schema: dict[str, Any]) -> list[str]:
    """The JSON types a property schema allows, in the order given (anyOf/oneOf flattened)."""
    t = schema.get("type")
    types = [t] if isinstance(t, str) else list(t or [])
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict):
                types += _schema_types(sub)
    if not types and "enum" in schema:
        types = ["string" if isinstance(v, str) else "number" for v in schema["enum"]]
    return types


def _as(kind: str, text: str) -> tuple[bool, Any]:
    s = text.strip()
    if kind == "integer" and _INTEGER.fullmatch(s):
        return True, int(s)
    if kind == "number":
        if _INTEGER.fullmatch(s):
            return True, int(s)
        try:
            value = float(s)
        except ValueError:
            return False, None
        return value == value and abs(value) != float("inf"), value
    if kind == "boolean" and s.lower() in ("true", "false"):
        return True, s.lower() == "true"
    if kind == "null" and s.lower() in ("null", "none"):
        return True, None
    if kind in ("object", "array"):
        try:
            value = json.loads(s)
        except json.JSONDecodeError:
            return False, None
        return isinstance(value, dict if kind == "object" else list), value
    return False, None


def typed_value(text: str, schema: dict[str, Any] | None) -> Any:
    types = _schema_types(schema) if isinstance(schema, dict) else []
    for kind in types:
        if kind == "string":
            continue  # the fallback: tried after every other type the schema allows
        ok, value = _as(kind, text)
        if ok:
            return value
    return text


def typed_arguments(args: dict[str, str], parameters: dict[str, Any] | None) -> dict[str, Any]:
    """{name: text} -> {name: value typed by parameters["properties"][name]}."""
    props = (parameters or {}).get("properties") or {}
    return {name: typed_value(text, props.get(name)) for name, text in args.items()}
