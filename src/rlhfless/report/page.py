"""A self-contained HTML page: PNGs inlined as base64 data URIs, styles inline, no external assets."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from html import escape


@dataclass(frozen=True)
class Image:
    """A rendered figure: `name` is its file stem beside the page, `caption` says what to look at."""

    name: str
    png: bytes
    caption: str


@dataclass
class Section:
    """A titled part of the page; `notes` say what could not be shown and why."""

    anchor: str
    title: str
    intro: str = ""
    notes: list[str] = field(default_factory=list)
    images: list[Image] = field(default_factory=list)
    html: list[str] = field(default_factory=list)


NUMBER = re.compile(r"^[-+<]?\d")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1340px; padding: 0 20px 40px;
       color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 1.8em; }
nav a { margin-right: 1em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 3px 9px; text-align: left; }
td.num { text-align: right; }
tr.chosen { background: #e8f5e9; font-weight: bold; }
.missing { background: #fff4e5; border-left: 4px solid #ff9800; padding: 4px 10px; margin: 4px 0; }
.problems li { color: #a15c00; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 0.85em; }
"""


def table(header: list[str], rows: list[list[str]], row_classes: list[str] | None = None) -> str:
    """An HTML table from already formatted cell strings (escaped here)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f"<td{' class=num' if NUMBER.match(c) else ''}>{escape(c)}</td>" for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _section(section: Section) -> str:
    parts = [f'<section id="{section.anchor}"><h2>{escape(section.title)}</h2>']
    if section.intro:
        parts.append(f"<p>{escape(section.intro)}</p>")
    parts += [f'<p class="missing">{escape(note)}</p>' for note in section.notes]
    for image in section.images:
        data = base64.b64encode(image.png).decode("ascii")
        parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{escape(image.caption)}">'
            f"<figcaption>{escape(image.caption)}</figcaption></figure>"
        )
    parts += section.html
    parts.append("</section>")
    return "\n".join(parts)


def render(title: str, subtitle: str, sections: list[Section]) -> str:
    nav = " ".join(f'<a href="#{s.anchor}">{escape(s.title)}</a>' for s in sections)
    body = "\n".join(_section(s) for s in sections)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n"
        f"<body><h1>{escape(title)}</h1><p>{escape(subtitle)}</p><nav>{nav}</nav>\n{body}\n</body></html>\n"
    )
