"""How the report writes a figure or a number into the page."""

from __future__ import annotations

from pathlib import Path

from rlhfless.report import figures
from rlhfless.report.page import Image


def fmt(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 or value == 0 else f"{1000 * value:.3g} ms"


def size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def image(out: Path, slug: str, fig, caption: str) -> Image:
    return Image(name=f"{out.stem}-{slug}", png=figures.png(fig), caption=caption)
