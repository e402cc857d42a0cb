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


def _union_member(tag: Any) -> bool:
    """Whether a loc entry is pydantic's tag of a union member (`bool`, `literal['auto']`,
    `list[str]`), not a key."""
    return isinstance(tag, str) and (
        tag in ("bool", "int", "float", "str") or tag.startswith(("literal[", "list["))
    )


def _member_expects(error: Any, depth: int) -> str:
    """What one union member expected; a list member's item (its loc past the member's tag) by
    its index."""
    expected = _expected(error).split(", ")[0]
    inner = error["loc"][depth + 1 :]
    return f"a list whose item {inner[0]} is {expected}" if inner else expected


def _describe(errors: list[Any]) -> str:
    """The first of pydantic's errors as `dotted.key: got X, expected Y`; a value that fits no
    member of a union (`bool | Literal['auto']`, `str | list[str]`) expects any of them."""
    error = errors[0]
    loc, expected = error["loc"], _expected(error)
    if loc and _union_member(loc[-1]):
        loc = loc[:-1]
        members = [
            e
            for e in errors
            if e["loc"][: len(loc)] == loc and len(e["loc"]) > len(loc) and _union_member(e["loc"][len(loc)])
        ]
        expected = " or ".join(_member_expects(e, len(loc)) for e in members)
    where = ".".join(str(p) for p in loc)
    if error["type"] == "value_error":  # a __post_init__ check: "field: got X, expected Y"
        return f"{where}.{expected}" if where else expected
    return f"{where}: got {error.get('input')!r}, expected {expected}"


def _expected(error: Any) -> str:
    message = error["msg"]
    if error["type"] == "value_error":
        return message.removeprefix("Value error, ")
    return message.removeprefix("Input should be ").removeprefix("Input should ")


def typed(cls: type[T], tree: dict[str, Any]) -> T:
    """`tree` as an instance of dataclass `cls`; ValueError (one line) naming the first bad key."""
    try:
        return _adapter(cls).validate_python(tree)
    except pydantic.ValidationError as err:
        raise ValueError(_describe(err.errors())) from None


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
