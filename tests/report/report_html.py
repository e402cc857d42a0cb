"""Pick apart a report page: the images, section headings and missing-data notes it holds."""

from __future__ import annotations

from html.parser import HTMLParser


class PageParts(HTMLParser):
    """The parts of a report page the tests check: images, headings, missing-data notes, table cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []
        self.headings: list[str] = []
        self.notes: list[str] = []
        self.links: list[str] = []
        self.tables: list[list[list[str]]] = []  # per table, its body rows' cell texts
        self._capture: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        if tag == "img":
            self.images.append(attributes)
        for key in ("src", "href"):
            if key in attributes and tag != "img":
                self.links.append(attributes[key])
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag == "td" and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("")
            self._capture = self.tables[-1][-1]
        if tag == "h2" or (tag == "p" and attributes.get("class") == "missing"):
            self._capture = self.headings if tag == "h2" else self.notes
            self._capture.append("")

    def handle_data(self, data: str) -> None:
        if self._capture is not None:
            self._capture[-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "p", "td"):
            self._capture = None
