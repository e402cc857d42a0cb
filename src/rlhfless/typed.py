"""A nested dict of config values as typed dataclasses, refused in the one form of `checks`.

pydantic checks every value against its field's type (an `int` field refuses 2.5 and 'abc') and
runs each section's `__post_init__`; the first error is re-raised as a `ValueError` that names the
dotted key: `cluster.nodes: got 'abc', expected a valid integer, ...`.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

import pydantic

T = TypeVar("T")


@cache
def _adapter(cls: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def describe(error: Any) -> str:
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
        raise ValueError(describe(err.errors()[0])) from None
