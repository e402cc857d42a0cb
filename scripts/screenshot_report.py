"""Render a report page in headless Chromium and save a PNG screenshot, to look at what users see.

    python scripts/screenshot_report.py RUN_DIR/report.html --out shot.png [--height 4000]
    python scripts/screenshot_report.py --runs RUN_DIR [RUN_DIR ...] --out shot.png

With --runs it first writes the report of those runs (next to the first run) and then renders it.
Offline by construction: networking, sync and updates are disabled, so a page that needed any
external asset would show up broken in the screenshot.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 4000, timeout: float = 120) -> Path:
    """Render `page` at width x height; raise if no browser or it writes no screenshot."""
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError(f"none of {', '.join(BROWSERS)} is installed")
    out = out.resolve()
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--screenshot={out}",
            f"--window-size={width},{height}",
            page.resolve().as_uri(),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if not out.is_file():
        raise RuntimeError(
            f"{browser} wrote no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("page", nargs="?", type=Path, help="report HTML to render")
    parser.add_argument("--runs", nargs="+", type=Path, help="write the report of these run dirs first")
    parser.add_argument("--out", type=Path, required=True, help="screenshot PNG to write")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=4000)
    args = parser.parse_args()
    if (args.page is None) == (args.runs is None):
        parser.error("give either a report page or --runs")
    page = args.page
    if args.runs:
        from rlhfless.report import write_report

        page = write_report(args.runs)
    print(screenshot(page, args.out, args.width, args.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
