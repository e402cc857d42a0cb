"""What `rlhfless plan` prints for a person (`--json` prints everything): one step's plan, or a
whole run's forecast, and the one-line forecast `rlhfless train` also prints."""

from __future__ import annotations

from typing import Any

SHOWN_STEPS = 20  # a longer run's forecast shows its first and last steps
SHOWN_ACTORS = 16  # more actors than this: the slowest are listed (`--json` has them all)
# A probe this many times off the earlier runs' speed is named: in quiet, eight probes in a row
# here agreed within 10%, while runs minutes apart read 1.3-2.2x apart beside other load.
DRIFT = 1.25


def seconds(x: float) -> str:
    """Whole seconds, or two significant digits under ten (a tiny model's run is under a second)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def forecast_line(info: dict[str, Any]) -> str:
    """A run forecast in one line: total time and cost, their ranges, and what the range assumes."""
    (lo, hi), (clo, chi) = info["time_range_s"], info["cost_range"]
    validations = ""
    if info.get("validation/count"):
        validations = (
            f"; and {int(info['validation/count'])} validation(s): {seconds(info['validation/seconds'])} s, "
            f"${info['validation/cost']:.4g}"
        )
    return (
        f"forecast for {info['steps']} step(s): {seconds(info['time_s'])} s "
        f"({seconds(lo)}-{seconds(hi)}), "
        f"${info['cost']:.4g} (${clo:.4g}-{chi:.4g}); {info['range']}{validations}"
    )


def drift_warning(info: dict[str, Any]) -> str | None:
    """What a forecast says where the speed probe reads the machine far from the speed earlier
    runs here ran at (`memory/speed`): it scales what they learned by that, rightly or not."""
    drift = info.get("memory/speed")
    if drift is None or 1 / DRIFT <= drift <= DRIFT:
        return None
    return (
        f"the speed probe reads this machine's step times x{drift:.2f} those of the earlier runs here; "
        "where a passing load (or a quiet spell) made it so, the forecast is off by as much until "
        "the run's own steps correct it"
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
    if "machine/speed" in out:
        lines.append(
            f"machine speed: the cached time figures x {out['machine/speed']:.2f} (the probe's "
            f"decode steps: {', '.join(f'{ms:.1f}' for ms in out['machine/probe_ms'])} ms)"
        )
    if "memory/steps" in out:
        learned = int(out["memory/steps"])
        lines.append(
            f"time model: from {learned} step(s) that {int(out.get('memory/runs', 0)) or 'earlier'} run(s) "
            "here observed, at the speed their decode steps showed (runtime.calibration_memory)"
            if learned
            else "time model: the cached time table and learning rate alone (no earlier run of this "
            "model, threads and policy here): how fast the run's functions meet the machine, only "
            "its first step measures"
        )
    lines += [f"warning: {w}" for w in (drift_warning(out), out.get("warning")) if w]
    rows = out["per_step"]
    ranks = any(r.get("learner_width") for r in rows)  # a budget or deadline chose them
    lines.append(
        f"{'step':>6} {'time s':>9} {'cost $':>10} {'generation s':>13} {'actors':>7}"
        + (f" {'ranks':>6}" if ranks else "")
    )
    if len(rows) > SHOWN_STEPS:  # the first steps and the last: --json has every one
        cut = len(rows) - SHOWN_STEPS
        rows = [*rows[: SHOWN_STEPS - 4], {"skipped": cut}, *rows[-4:]]
    for row in rows:
        if "skipped" in row:
            lines.append(f"{'...':>6} ({row['skipped']} more steps; --json lists every step)")
            continue
        lines.append(
            f"{row['step']:>6} {row['time']:9.2f} {row['cost']:10.4g} {row['generation_time']:13.2f} "
            f"{row['n_actors']:>7}" + (f" {row.get('learner_width', 0):>6}" if ranks else "")
        )
    return "\n".join(lines)


def _sizes(out: dict[str, Any]) -> list[str]:
    """One line per decode actor size the planner weighed, and a split between two (none where
    it had one size); `*` marks the plan taken."""
    lines = []
    for i, o in enumerate(out.get("shape_options") or []):
        taken = o["n"] == out["n_actors"] and o["step_time"] == out["predicted_step_time"]
        parts = o.get("pools") or [[o["gpus"], o["n"], None]]
        what = " + ".join(
            f"TP {gpus:g}" + (f" x {n:g} ({prompts:g} prompts)" if prompts is not None else f": N {n:g}")
            for gpus, n, prompts in parts
        )
        lines.append(
            f"{'sizes' if i == 0 else '':13s} {'*' if taken else ' '} {what}, generation {o['time']:.2f} s "
            f"${o['cost']:.4g}, step {o['step_time']:.2f} s ${o['step_cost']:.4g}"
        )
    return lines


def step_summary(out: dict[str, Any], scheduler: Any, cluster: Any) -> str:
    """One step's plan for a person: what was chosen and why, what it costs, how far from the
    floor, what the prefill shares, the candidates around the choice, and the actors."""
    actors, floor, prefill = out["actors"], out["floor"], out["prefill"]
    prompts = sum(len(a["uids"]) for a in actors)
    target = out["target"]
    split = any(
        "pools" in o and o["n"] == out["n_actors"] and o["step_time"] == out["predicted_step_time"]
        for o in out.get("shape_options") or []
    )
    if target:
        key = next(k for k in target if k != "missed")
        chosen = f"chosen by {key} {target[key]:g}" + (
            " (missed: the nearest plan)" if target["missed"] else ""
        )
    else:
        chosen = f"chosen by lam {scheduler.lam:g}" + (
            f", within {out['time_cap']:.1f} s" if out["time_cap"] else ""
        )
    if split:  # a split's N is its parts' own choices
        why = f"a split between two sizes, {chosen}"
    elif len(out["candidates"]) == 1:
        why = "N fixed (no actor scaling)"
    else:
        why = chosen
    ratio = out["predicted_time"] / floor["time_s"] if floor["time_s"] else float("nan")
    gpus = [str(g) for g in sorted({a["gpus"] for a in actors}, reverse=True)]
    lines = [
        f"plan: {prompts} prompts x {out['group_size']} samples, policy {out['policy']} "
        f"({out['plan_seconds'] * 1e3:.1f} ms to plan)",
        f"profile       {out['profile']}",
        f"actors        {out['n_actors']} decode actor(s) of {' and '.join(gpus) or 0} GPU(s), "
        f"on a cluster of {cluster.nodes} x {cluster.gpus_per_node} GPUs; {why}",
        *_sizes(out),
        f"generation    {out['predicted_time']:.2f} s, ${out['predicted_cost']:.4g} predicted; floor "
        f"{floor['time_s']:.2f} s (latency {floor['latency_s']:.2f}, throughput "
        f"{floor['throughput_s']:.2f}), {ratio:.2f}x; work floor ${floor['work_cost']:.4g}",
        f"whole step    {out['predicted_step_time']:.2f} s, ${out['predicted_step_cost']:.4g} predicted",
        f"prefill       {prefill['rule']}: {prefill['tokens_computed']:,} prompt tokens computed, "
        f"{prefill['tokens_naive']:,} without dedup, {prefill['tokens_unique']:,} unique "
        f"({prefill['tree_ratio']:.2f}x); {out['unique_prefixes']} shared prefix group(s)",
        "candidates    (* chosen; score: lam's weighing of time against cost, lower wins; wait: "
        "learning's for its ranks)",
        f"  {'N':>5} {'time s':>9} {'cost $':>10} {'score':>7} {'wait s':>7}",
    ]
    rows = out["candidates"]
    at = next(i for i, c in enumerate(rows) if c["n"] == out["n_actors"])
    for c in rows[max(0, at - 3) : at + 4]:
        mark = "*" if c["n"] == out["n_actors"] else " "
        lines.append(
            f"{mark} {c['n']:>5} {c['time']:9.2f} {c['cost']:10.4g} {c['score']:7.3f} {c.get('wait', 0.0):7.2f}"
        )
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
