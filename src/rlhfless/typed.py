"""A nested dict of config values as typed dataclasses, refused in the one form of `checks`; and
back, as YAML with every key's help text.

pydantic checks every value against its field's type (an `int` field refuses 2.5 and 'abc') and
runs each section's `__post_init__`; the first error is re-raised as a `ValueError` that names the
dotted key: `cluster.nodes: got 'abc', expected a valid integer, ...`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from functools import cache
from typing import Any, TypeVar

import pydantic

T = TypeVar("T")


@cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def _describe(error: Any) -> str:
    """One pydantic error as `dotted.key: got X, expected Y`."""
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"]
    if error["type"] == "value_error":  # a __post_init__ check: "field: got X, expected Y"
        message = message.removeprefix("Value error, ")
        return f"{where}.{message}" if where else message
    expected = message.removeprefix("Input should be ").removeprefix("Input should ")
    return f"{where}: got {error.get('input')!r}, expected {expected}"


def typed(cls: type[T], tree: dict[str, Any]) -> T:
    """`tree` as an instance of dataclass `cls`; ValueError (one line) naming the first bad key."""
    try:
        return _adapter(cls).validate_python(tree)
    except pydantic.ValidationError as err:
        raise ValueError(_describe(err.errors()[0])) from None


def render(config: Any, width: int = 100) -> str:
    """Dataclass `config` as YAML that `typed` reads back to it, each section and key under its
    help text as a comment: every key, where it goes, and what it does (`--show-config`)."""
    lines: list[str] = []

    def comment(text: str, pad: str) -> None:
        lines.extend(
            textwrap.wrap(text, width - len(pad), initial_indent=f"{pad}# ", subsequent_indent=f"{pad}# ")
        )

    def walk(section: Any, pad: str) -> None:
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value):
                comment(f.metadata.get("help") or (type(value).__doc__ or "").split("\n")[0], pad)
                lines.append(f"{pad}{f.name}:")
                walk(value, pad + "  ")
                continue
            if f.metadata.get("help"):
                comment(f.metadata["help"], pad)
            lines.append(f"{pad}{f.name}: {_yaml_value(value)}")

    walk(config, "")
    return "\n".join(lines) + "\n"


def _yaml_value(value: Any) -> str:
    """One value in YAML flow style: JSON, which YAML reads, except for the floats JSON lacks."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value)
