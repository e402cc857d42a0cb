"""`rlhfless plan`: the planner's decision for one step, or the forecast of a whole run; a summary
for a person, or everything as JSON with `--json`.

`rlhfless plan --run [CONFIG] [key=value ...]` forecasts a training run's total time and cost, and
the range it may fall in, before paying for it: every step is planned as `rlhfless train` would
plan it (same data order, profile, pricing and planner), on first-epoch length estimates, with
the learning phase timed once on a synthetic batch, after the length pilot `rlhfless train` runs
first (`scheduler.length_pilot`, or `--pilot K`: at least K prompts of each data source sampled
with the real model to learn their lengths, more where the profile decodes them at about the same
step time; nothing is trained). CONFIG is read as `rlhfless train` reads it: a YAML file, a
preset's name or `--preset NAME`, the default preset where none is given.

`rlhfless plan --prompts FILE.jsonl` plans one step of a JSONL file of prompts.

Each line: `uid` (string), `prompt_tokens` (list of token ids), optionally `history` (past response
lengths, oldest first; an entry is one step's length or the list of that step's sample lengths) and
`answer_tokens` (int, the ground-truth answer's token count). Overrides are config keys such as
`scheduler.tau=0.5` or `algorithm.group_size=8`. Without `--profile` the time table is derived by
the roofline model for `--model` on `--gpu` and the output says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rlhfless.commands.config_args import split_config
from rlhfless.commands.plan_summary import run_summary, step_summary
from rlhfless.config import PRESETS
from rlhfless.inputs import MB, InputError, iter_lines, read_text

# The planner holds every row's token ids: a larger file is refused before it is read.
MAX_PROMPTS_BYTES = 256 * MB


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="print the planner's decision for a file of prompts, or a whole run's forecast"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides (scheduler.*, ...)"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompts", type=Path, help="JSONL: uid, prompt_tokens[, history, answer_tokens]")
    what.add_argument(
        "--run",
        nargs="?",
        const="",
        metavar="CONFIG",
        help="forecast this training run, as `rlhfless train` takes it: a YAML file or a preset's "
        "name, or --preset (default: the default preset)",
    )
    parser.add_argument("--preset", choices=PRESETS, help="--run: start from a built-in preset")
    parser.add_argument(
        "--pilot",
        type=int,
        help="--run: prompts of each data source sampled first, at least (0: none; default: the "
        "config's scheduler.length_pilot, as `rlhfless train` does)",
    )
    parser.add_argument(
        "--profile", type=Path, help="time table JSON (rlhfless profile --json); default: roofline"
    )
    parser.add_argument(
        "--model", default="qwen2.5-3b", help="model shape for the default table and weight size"
    )
    parser.add_argument("--gpu", default="l40s", help="GPU for the default table and link speeds")
    parser.add_argument(
        "--decode-tp",
        help="comma-separated tensor-parallel sizes the decode actors may take, the planner "
        "choosing one with N (rlhfless with actor scaling, roofline tables); default: "
        "scheduler.gpus_per_actor and every smaller power of two whose GPUs keep as much memory "
        "for KV as for weights",
    )
    parser.add_argument("--nodes", type=int, default=2, help="nodes in the cluster")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node")
    parser.add_argument("--config", help="YAML config file (default: the default preset)")
    parser.add_argument("--json", action="store_true", help="print the whole plan or forecast as JSON")


def _fail(message: str) -> int:
    print(f"rlhfless plan: {message}", file=sys.stderr)
    return 2


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _sizes(text: str) -> list[int]:
    """`--decode-tp`'s sizes, sorted: comma-separated integers >= 1."""
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--decode-tp: got {text!r}, expected comma-separated integers >= 1")
    return sorted({int(p) for p in parts})


def _history_entry(value: Any) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return [value]
    if _int_list(value) and value and min(value) >= 0:
        return value
    return None


def read_prompts(path: Path, max_prompt_tokens: int | None = None) -> list[dict[str, Any]]:
    """Rows of the prompts file, streamed; ValueError naming file, row and field on bad input."""
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    rows, seen = [], set()
    for number, line in iter_lines(path, "a JSONL file of prompts", MAX_PROMPTS_BYTES):
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: got {type(row).__name__}, expected a JSON object")
        uid = row.get("uid")
        if not isinstance(uid, str) or not uid:
            raise ValueError(f"{where}: uid: got {uid!r}, expected a non-empty string")
        if uid in seen:
            raise ValueError(f"{where}: uid: got {uid!r} again, expected unique uids")
        seen.add(uid)
        tokens = row.get("prompt_tokens")
        if not _int_list(tokens) or not tokens or min(tokens) < 0 or max(tokens) >= 2**31:
            raise ValueError(
                f"{where}: prompt_tokens: got {str(tokens)[:40]}, expected a non-empty list of token ids"
            )
        if max_prompt_tokens is not None and len(tokens) > max_prompt_tokens:
            raise ValueError(
                f"{where}: prompt_tokens: got {len(tokens)} tokens, expected at most "
                f"generation.max_prompt_tokens={max_prompt_tokens}"
            )
        answer = row.get("answer_tokens")
        if answer is not None and (not isinstance(answer, int) or isinstance(answer, bool) or answer < 0):
            raise ValueError(f"{where}: answer_tokens: got {answer!r}, expected an integer >= 0 or null")
        history = row.get("history", [])
        if not isinstance(history, list) or any(_history_entry(h) is None for h in history):
            raise ValueError(
                f"{where}: history: got {str(history)[:40]}, expected a list of lengths (ints or lists of ints)"
            )
        rows.append({"uid": uid, "prompt_tokens": tokens, "answer_tokens": answer, "history": history})
    if not rows:
        raise ValueError(f"{path}: no prompts, expected one JSON object per line")
    return rows


def forecast(args: argparse.Namespace) -> int:
    """`--run`: the whole run's forecast, labelled with what it rests on."""
    from rlhfless.config import ConfigError, load_config
    from rlhfless.data import DataError
    from rlhfless.models import ModelError

    try:
        path, preset, overrides = split_config(
            [args.run, *args.overrides] if args.run else args.overrides, args.preset
        )
        if path is not None:
            read_text(Path(path), "a YAML config (a mapping of sections)")
        if args.pilot is not None:
            overrides.append(f"scheduler.length_pilot={max(0, args.pilot)}")
        cfg = load_config(path, preset=preset, overrides=tuple(overrides))
    except (ConfigError, InputError) as err:
        return _fail(str(err))
    if cfg.validation.only:  # its forecast would be of steps that never run
        return _fail(
            "validation.only: got true, expected false: --run forecasts a training run, and "
            "validation.only trains nothing (rlhfless train scores the held-out set once)"
        )
    from rich.console import Console

    from rlhfless.runtime.run_forecast import forecast_for_config

    console = Console(stderr=True)  # a spinner while the pilot samples and every step is planned
    waiting = (
        console.status(f"forecasting {cfg.trainer.steps} step(s)") if console.is_terminal else nullcontext()
    )
    try:
        with waiting:
            out = forecast_for_config(cfg)
    except (DataError, InputError, ModelError, ValueError, OSError) as err:
        return _fail(str(err))
    out = {"forecast": "whole run, before training (not measured)", **out}
    print(json.dumps(out, indent=1) if args.json else run_summary(out))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.run is not None:
        return forecast(args)
    if args.preset:
        return _fail("--preset: goes with --run; --prompts reads --config")
    from rlhfless.config import ConfigError, load_config
    from rlhfless.planner.billing import Billing
    from rlhfless.planner.forecast import SPLIT_PRIOR
    from rlhfless.planner.hardware import GpuSpec, ModelShape, decode_sizes, roofline_profile
    from rlhfless.planner.placement import ClusterSpec
    from rlhfless.planner.predictor import LengthPredictor
    from rlhfless.planner.profile import Profile
    from rlhfless.planner.sizes import plan_shapes
    from rlhfless.planner.step_plan import PromptSpec

    try:
        if args.config:  # a missing, empty, huge or non-UTF-8 file is named before YAML sees it
            read_text(Path(args.config), "a YAML config (a mapping of sections)")
        cfg = load_config(args.config, overrides=tuple(args.overrides))
    except (ConfigError, InputError) as err:
        return _fail(str(err))
    scheduler, group_size = cfg.scheduler, cfg.algorithm.group_size
    try:
        rows = read_prompts(args.prompts, cfg.generation.max_prompt_tokens)
        shape = ModelShape.resolve(args.model)
        baseline = None
        if args.profile:
            profiles = [Profile.load(args.profile)]
            source = f"table {args.profile}" + (f" ({profiles[0].note})" if profiles[0].note else "")
            if args.decode_tp and _sizes(args.decode_tp) != [profiles[0].gpus]:
                raise ValueError(
                    f"--decode-tp: got {args.decode_tp!r}, expected only the measured table's size "
                    f"({profiles[0].gpus}): other sizes are untimed"
                )
        else:
            largest = scheduler.gpus_per_actor
            sizes = _sizes(args.decode_tp) if args.decode_tp else decode_sizes(shape, args.gpu, largest)
            if not scheduler.features["actor_scaling"]:  # the baselines' and fixed N: one size
                sizes = [largest]
            profiles = [roofline_profile(shape, args.gpu, tp) for tp in sizes]
            baseline = roofline_profile(shape, args.gpu, largest)  # verl's size: lam's cap
            source = "built-in default (derived, not measured): "
        gpu = GpuSpec.resolve(args.gpu)
        cluster = ClusterSpec(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            intra_node_bandwidth=gpu.link_gbps * 1e9,
            inter_node_bandwidth=gpu.inter_node_gbps * 1e9,
            model_bytes=shape.weight_bytes,
            kv_bytes_per_token=shape.kv_bytes_per_token,
        )
        predictor = LengthPredictor.from_config(scheduler)
        for row in rows:
            for entry in row["history"]:
                predictor.update(row["uid"], _history_entry(entry))
        prompts = [PromptSpec(r["uid"], r["prompt_tokens"], r["answer_tokens"]) for r in rows]
        # A split is weighed as a run's first step weighs it, before the run measured its own.
        billing = Billing(scheduler.pricing, split_shortfall=SPLIT_PRIOR)
        plan = plan_shapes(
            prompts, predictor, profiles, cluster, scheduler, group_size, billing, baseline=baseline
        )
    except (ValueError, OSError) as err:
        return _fail(str(err))
    if not args.profile:  # the size the plan took
        source += plan.profile.note if plan.profile else ""
    out = {"profile": source, "group_size": group_size, **plan.to_dict()}
    print(json.dumps(out, indent=1) if args.json else step_summary(out, scheduler, cluster))
    return 0
