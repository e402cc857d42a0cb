"""`rlhfless` command line: one sub-command per module named in `COMMANDS` (`rlhfless.commands`)."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module exposes `add_parser(subparsers)` and `run(args) -> int`.
COMMANDS = ("train", "export", "plan", "profile", "simulate", "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlhfless", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"rlhfless.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"rlhfless.commands.{name}":
                raise
            continue
        module.add_parser(sub)
        modules[name] = module
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
