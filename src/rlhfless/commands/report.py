"""`rlhfless report`: one self-contained HTML page (and its PNGs) from recorded run directories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# One line per step of about a kilobyte: a larger metrics log is not a run's, and is not read.
MAX_METRICS_BYTES = 512 << 20


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


def check_run_dir(path: Path) -> None:
    """A directory `rlhfless train` wrote: metrics.jsonl or config.yaml, and a metrics file of sane size.

    Damage inside it (a truncated line, a null, bad bytes) is not refused: the page skips it and
    lists it under the run's problems, since a killed run's last write is expected to be cut short.
    """
    from rlhfless.inputs import InputError, check_file

    if not path.is_dir():
        state = "not found" if not path.exists() else "is a file"
        raise InputError(f"{path}: {state}, expected a run directory (the output_dir of rlhfless train)")
    metrics = path / "metrics.jsonl"
    if not metrics.exists() and not (path / "config.yaml").exists():
        raise InputError(
            f"{path}: no metrics.jsonl or config.yaml, expected a run directory (the output_dir of rlhfless train)"
        )
    if metrics.exists():
        check_file(metrics, "a run's metrics log", MAX_METRICS_BYTES)


def run(args: argparse.Namespace) -> int:
    from rlhfless.inputs import InputError, check_writable

    try:
        for path in args.run_dirs:
            check_run_dir(path)
        check_writable(args.out or args.run_dirs[0] / "report.html", "--out")
    except InputError as err:
        print(f"rlhfless report: {err}", file=sys.stderr)
        return 2
    # Imported here: the dispatcher imports every command, and matplotlib is slow to load.
    from rlhfless.report import write_report

    print(write_report(args.run_dirs, args.out))
    return 0
