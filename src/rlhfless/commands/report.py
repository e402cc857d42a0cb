"""`rlhfless report`: one self-contained HTML page (and its PNGs) from recorded run directories."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write an HTML report of one or more run directories",
        description="Draw the curves, cost, timelines, phases, lengths and scaling decisions of recorded "
        "runs into one self-contained HTML page; several runs are compared against the first.",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="recorded run directories")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE.html",
        help="page to write (default RUN_DIR/report.html)",
    )


def run(args: argparse.Namespace) -> int:
    # Imported here: the dispatcher imports every command, and matplotlib is slow to load.
    from rlhfless.report import write_report

    missing = [str(p) for p in args.run_dirs if not p.is_dir()]
    if missing:
        print(f"not a run directory: {', '.join(missing)}")
        return 2
    print(write_report(args.run_dirs, args.out))
    return 0
