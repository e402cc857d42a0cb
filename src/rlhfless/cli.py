"""`rlhfless` command line: one sub-command per module named in `COMMANDS` (`rlhfless.commands`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rlhfless import __version__

DESCRIPTION = (
    "Synchronous RLHF post-training (GRPO, RLOO, REINFORCE++, PPO) whose rollout workers run as "
    "elastic Ray functions: train a policy, forecast a run's time and cost before paying for it "
    "(plan --run), simulate clusters you do not have, and report runs side by side."
)
# Each module exposes `add_parser(subparsers)` and `run(args) -> int`.
COMMANDS = ("train", "export", "plan", "profile", "simulate", "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlhfless", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"rlhfless {__version__}")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    name = parser.parse_known_args(argv)[0].command
    # The command's own arguments intermixed, as users type them: a flag may stand between the
    # positionals (`train run.yaml --resume trainer.steps=8`), which plain parsing refuses.
    args = sub.choices[name].parse_intermixed_args(
        argv[argv.index(name) + 1 :], argparse.Namespace(command=name)
    )
    try:
        return int(modules[name].run(args) or 0)
    except BrokenPipeError:  # the reader went away (`| head`): quiet, as a Unix tool is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM in train: one line, not a traceback
        term = bool(err.args) and err.args[0] == "SIGTERM"  # `runtime.trainer.Interrupted`
        how = "stopped by SIGTERM" if term else "interrupted"
        resume = (
            "; `rlhfless train ... --resume` continues from the last checkpoint" if name == "train" else ""
        )
        print(f"rlhfless {name}: {how}{resume}", file=sys.stderr)
        return 143 if term else 130


if __name__ == "__main__":
    sys.exit(main())
