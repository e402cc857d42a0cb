"""`rlhfless export`: a run's checkpoint as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a checkpoint's policy as a Hugging Face model directory",
        description="Write the policy of a checkpoint, with its tokenizer, as a model directory that "
        "transformers and vLLM load, and that a new run takes as model.path=DIR.",
    )
    parser.add_argument(
        "source",
        type=Path,
        metavar="RUN_DIR|CHECKPOINT",
        help="a run directory (its newest checkpoint) or one RUN_DIR/checkpoints/step_N directory",
    )
    parser.add_argument("target", type=Path, metavar="OUT_DIR", help="the model directory to create")


def run(args: argparse.Namespace) -> int:
    from rlhfless.config import ConfigError
    from rlhfless.inputs import InputError
    from rlhfless.models import ModelError
    from rlhfless.runtime.export import ExportError, export_checkpoint

    try:
        checkpoint = export_checkpoint(args.source, args.target)
    except (ExportError, ConfigError, InputError, ModelError) as err:
        print(f"rlhfless export: {err}", file=sys.stderr)
        return 2
    print(f"exported {checkpoint} to {args.target}; train from it with model.path={args.target}")
    return 0
