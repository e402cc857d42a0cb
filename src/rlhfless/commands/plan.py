"""`rlhfless plan`: the planner's decision for one step, or the forecast of a whole run; a summary
for a person, or everything as JSON with `--json`.

`rlhfless plan --run CONFIG [key=value ...]` forecasts a training run's total time and cost, and
the range it may fall in, before paying for it: every step is planned as `rlhfless train` would
plan it (same data order, profile, pricing and planner), on first-epoch length estimates, with
the learning phase timed once on a synthetic batch, after the length pilot `rlhfless train` runs
first (`scheduler.length_pilot`, or `--pilot K`: at least K prompts of each data source sampled
with the real model to learn their lengths, more where the profile decodes them at about the same
step time; nothing is trained). CONFIG is a YAML file or a preset name
(default, tiny).

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
from pathlib import Path
from typing import Any

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
        "--run", metavar="CONFIG", help="forecast this training run (a YAML file or a preset name)"
    )
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
    parser.add_argument("--nodes", type=int, default=2, help="nodes in the cluster")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node")
    parser.add_argument("--config", help="YAML config file (default: the default preset)")
    parser.add_argument("--json", action="store_true", help="print the whole plan or forecast as JSON")


def _fail(message: str) -> int:
    print(f"rlhfless plan: {message}", file=sys.stderr)
    return 2


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


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
    from rlhfless.config import PRESETS, ConfigError, load_config
    from rlhfless.data import DataError
    from rlhfless.models import ModelError

    preset = args.run if args.run in PRESETS and not Path(args.run).exists() else None
    try:
        if preset is None:
            read_text(Path(args.run), "a YAML config (a mapping of sections)")
        pilot = () if args.pilot is None else (f"scheduler.length_pilot={max(0, args.pilot)}",)
        overrides = (*args.overrides, *pilot)
        cfg = load_config(None if preset else args.run, preset=preset, overrides=overrides)
    except (ConfigError, InputError) as err:
        return _fail(str(err))
    from rlhfless.runtime.run_forecast import forecast_for_config

    try:
        out = forecast_for_config(cfg)
    except (DataError, InputError, ModelError, ValueError, OSError) as err:
        return _fail(str(err))
    out = {"forecast": "whole run, before training (not measured)", **out}
    print(json.dumps(out, indent=1) if args.json else run_summary(out))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.run is not None:
        return forecast(args)
    from rlhfless.config import ConfigError, load_config
    from rlhfless.planner.hardware import GpuSpec, ModelShape, roofline_profile
    from rlhfless.planner.placement import ClusterSpec
    from rlhfless.planner.plan import PromptSpec, plan_step
    from rlhfless.planner.predictor import LengthPredictor
    from rlhfless.planner.profile import Profile

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
        if args.profile:
            profile = Profile.load(args.profile)
            source = f"measured table {args.profile}"
        else:
            profile = roofline_profile(shape, args.gpu, scheduler.gpus_per_actor)
            source = f"built-in default (derived, not measured): {profile.note}"
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
        plan = plan_step(prompts, predictor, profile, cluster, scheduler, group_size)
    except (ValueError, OSError) as err:
        return _fail(str(err))
    out = {"profile": source, "group_size": group_size, **plan.to_dict()}
    print(json.dumps(out, indent=1) if args.json else step_summary(out, scheduler, cluster))
    return 0


SHOWN_STEPS = 20  # a longer run's forecast shows its first and last steps
SHOWN_ACTORS = 16  # more actors than this: the slowest are listed (`--json` has them all)


def forecast_line(info: dict[str, Any]) -> str:
    """A run forecast in one line: total time and cost, their ranges, and what the range assumes."""
    (lo, hi), (clo, chi) = info["time_range_s"], info["cost_range"]
    return (
        f"forecast for {info['steps']} step(s): {info['time_s']:.0f} s ({lo:.0f}-{hi:.0f}), "
        f"${info['cost']:.4g} (${clo:.4g}-{chi:.4g}); {info['range']}"
    )


def run_summary(out: dict[str, Any]) -> str:
    """`--run` for a person: the total, the pilot, and each step's forecast."""
    lines = [forecast_line(out) + " (before training, not measured)"]
    if out.get("pilot/prompts"):
        cached = " (lengths from the cache)" if out.get("pilot/cached") else ""
        lines.append(
            f"length pilot: {int(out['pilot/prompts'])} prompt(s), {out['pilot/seconds']:.1f} s, "
            f"${out['pilot/cost']:.4g}{cached} (in no step's figures)"
        )
    if "warning" in out:
        lines.append(f"warning: {out['warning']}")
    lines.append(f"{'step':>6} {'time s':>9} {'cost $':>10} {'generation s':>13} {'actors':>7}")
    rows = out["per_step"]
    if len(rows) > SHOWN_STEPS:  # the first steps and the last: --json has every one
        cut = len(rows) - SHOWN_STEPS
        rows = [*rows[: SHOWN_STEPS - 4], {"skipped": cut}, *rows[-4:]]
    for row in rows:
        if "skipped" in row:
            lines.append(f"{'...':>6} ({row['skipped']} more steps; --json lists every step)")
            continue
        lines.append(
            f"{row['step']:>6} {row['time']:9.2f} {row['cost']:10.4g} {row['generation_time']:13.2f} "
            f"{row['n_actors']:>7}"
        )
    return "\n".join(lines)


def step_summary(out: dict[str, Any], scheduler: Any, cluster: Any) -> str:
    """One step's plan for a person: what was chosen and why, what it costs, how far from the
    floor, what the prefill shares, the candidates around the choice, and the actors."""
    actors, floor, prefill = out["actors"], out["floor"], out["prefill"]
    prompts = sum(len(a["uids"]) for a in actors)
    target = out["target"]
    if len(out["candidates"]) == 1:
        why = "N fixed (no actor scaling)"
    elif target:
        key = next(k for k in target if k != "missed")
        why = f"chosen by {key} {target[key]:g}" + (" (missed: the nearest plan)" if target["missed"] else "")
    else:
        why = f"chosen by lam {scheduler.lam:g}" + (
            f", within {out['time_cap']:.1f} s" if out["time_cap"] else ""
        )
    ratio = out["predicted_time"] / floor["time_s"] if floor["time_s"] else float("nan")
    lines = [
        f"plan: {prompts} prompts x {out['group_size']} samples, policy {out['policy']} "
        f"({out['plan_seconds'] * 1e3:.1f} ms to plan)",
        f"profile       {out['profile']}",
        f"actors        {out['n_actors']} decode actor(s) of {actors[0]['gpus'] if actors else 0} GPU(s), "
        f"on a cluster of {cluster.nodes} x {cluster.gpus_per_node} GPUs; {why}",
        f"generation    {out['predicted_time']:.2f} s, ${out['predicted_cost']:.4g} predicted; floor "
        f"{floor['time_s']:.2f} s (latency {floor['latency_s']:.2f}, throughput "
        f"{floor['throughput_s']:.2f}), {ratio:.2f}x; work floor ${floor['work_cost']:.4g}",
        f"whole step    {out['predicted_step_time']:.2f} s, ${out['predicted_step_cost']:.4g} predicted",
        f"prefill       {prefill['rule']}: {prefill['tokens_computed']:,} prompt tokens computed, "
        f"{prefill['tokens_naive']:,} without dedup, {prefill['tokens_unique']:,} unique "
        f"({prefill['tree_ratio']:.2f}x); {out['unique_prefixes']} shared prefix group(s)",
        "candidates    (* chosen)",
        f"  {'N':>5} {'time s':>9} {'cost $':>10} {'score':>7}",
    ]
    rows = out["candidates"]
    at = next(i for i, c in enumerate(rows) if c["n"] == out["n_actors"])
    for c in rows[max(0, at - 3) : at + 4]:
        mark = "*" if c["n"] == out["n_actors"] else " "
        lines.append(f"{mark} {c['n']:>5} {c['time']:9.2f} {c['cost']:10.4g} {c['score']:7.3f}")
    shown = sorted(actors, key=lambda a: -a["predicted_time"])[:SHOWN_ACTORS]
    more = f", the {SHOWN_ACTORS} slowest" if len(actors) > SHOWN_ACTORS else ""
    lines += [
        f"actors        ({len(actors)}{more}; --json lists every uid)",
        f"  {'#':>4} {'node':>5} {'GPU ids':>9} {'prompts':>8} {'time s':>9} {'decode tok':>11} "
        f"{'prefill tok':>12} {'cold s':>7}",
    ]
    for a in sorted(shown, key=lambda a: a["actor"]):
        gpus = ",".join(map(str, a["gpu_ids"]))
        lines.append(
            f"  {a['actor']:>4} {a['node']:>5} {gpus:>9} {len(a['uids']):>8} {a['predicted_time']:9.2f} "
            f"{a['predicted_tokens']:11,.0f} {a['prefill_tokens']:12,.0f} {a['cold_start']:7.2f}"
        )
    return "\n".join(lines)
