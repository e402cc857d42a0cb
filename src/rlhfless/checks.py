"""The one form every config section uses to refuse a value: `name: got X, expected Y`."""

from __future__ import annotations

from typing import Any


def check(ok: bool, name: str, value: Any, expected: str) -> None:
    """Raise `ValueError("<name>: got <value>, expected <expected>")` unless `ok`."""
    if not ok:
        raise ValueError(f"{name}: got {value!r}, expected {expected}")
