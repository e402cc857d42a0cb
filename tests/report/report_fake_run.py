"""Write a realistic recorded run directory (docs/RUN_DIR.md) without training anything.

The numbers follow the design: per-prompt lengths stable across steps (so last step's group max is a
good predictor), decode actors split by sorted predicted length, cold starts on the first step, cuts
at tau = 0.7 with migrations, cost = GPUs x seconds alive. Same `seed` => same response texts, so two
runs that differ only in scheduling generate identical samples, as RLHFless promises.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CAP = 160
TPOT = 0.05
RHO = 1.0
TAU = 0.7
NODES = ("d1" * 28, "e2" * 28)  # Ray node ids: the driver's, a worker's
WORDS = ("so", "the", "answer", "is", "we", "add", "then", "carry", "check", "total")


def _response(rng: np.random.Generator, tokens: int) -> str:
    return " ".join(rng.choice(WORDS, size=max(tokens // 4, 1))) + f" answer {int(rng.integers(0, 100))}"


def _candidates(loads: list[float], lam: float = 0.7) -> list[dict]:
    """Candidate N: time is the slowest actor of a sorted split, cost is GPU-seconds of all actors."""
    rows = []
    order = sorted(loads, reverse=True)
    for n in range(1, 5):
        groups = [order[i::n] for i in range(n)]
        times = [1.0 + TPOT * max(g) * (1 + 0.15 * len(g)) for g in groups if g]
        rows.append({"n": n, "time": max(times), "cost": RHO * (sum(times) + 4.0 * n), "hidden": n < 4})
    t = np.array([r["time"] for r in rows])
    c = np.array([r["cost"] for r in rows])
    tn = (t - t.min()) / (t.max() - t.min()) if t.max() > t.min() else 0 * t
    cn = (c - c.min()) / (c.max() - c.min()) if c.max() > c.min() else 0 * c
    for r, score in zip(rows, lam * tn + (1 - lam) * cn, strict=True):
        r["score"] = float(score)
    return rows


def write_fake_run(
    path: Path,
    *,
    steps: int = 3,
    prompts: int = 6,
    samples: int = 4,
    seed: int = 0,
    planner: bool = True,
    runtime: bool = True,
    engine: bool = True,
    ppo: bool = False,
) -> Path:
    """Write a run directory; `runtime=False` is the plain in-process executor (no timeline, no cost)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(
        f"algo:\n  name: {'ppo' if ppo else 'grpo'}\n  samples: {samples}\n"
        f"planner:\n  enabled: {str(planner).lower()}\n  tau: {TAU}\n  lam: 0.7\n"
        f"runtime:\n  executor: {'ray' if runtime else 'local'}\n"
    )
    for folder, used in (("rollouts", True), ("plans", planner), ("timeline", runtime)):
        if used:
            (path / folder).mkdir(exist_ok=True)
    base = np.random.default_rng(seed).integers(20, CAP, size=prompts)
    previous: dict[str, int] = {}
    metrics = []
    for step in range(1, steps + 1):
        rng = np.random.default_rng([seed, step])
        uids = [f"gsm8k-{i}" for i in range(prompts)]
        lengths = {
            u: [int(np.clip(base[i] + rng.normal(0, 25), 5, CAP)) for _ in range(samples)]
            for i, u in enumerate(uids)
        }
        group_max = {u: max(v) for u, v in lengths.items()}
        predicted = {u: previous.get(u, int(base[i]) + 10) for i, u in enumerate(uids)} if planner else {}
        lines = [
            {
                "uid": u,
                "sample": k,
                "prompt": f"Question {u}: what is {i} + {step}?",
                "response": _response(rng, lengths[u][k]),
                "response_tokens": lengths[u][k],
                "reward": float(rng.random() < 0.3 + 0.1 * step),
                "predicted_length": predicted.get(u),
            }
            for i, u in enumerate(uids)
            for k in range(samples)
        ]
        (path / "rollouts" / f"step_{step:06d}.jsonl").write_text(
            "".join(json.dumps(x) + "\n" for x in lines)
        )
        previous = dict(group_max)

        order = sorted(uids, key=lambda u: -(predicted.get(u, group_max[u])))
        candidates = _candidates([predicted[u] for u in order]) if planner else []
        n = min(candidates, key=lambda r: r["score"])["n"] if planner else 4
        groups = [order[i::n] for i in range(n)]
        prefill_end = 1.2 if planner else 2.5
        cold = 8.0 if step == 1 else 0.4
        functions = [
            {
                "name": "learner",
                "kind": "learner",
                "resources": {"GPU": 1},
                "requested": 0.0,
                "started": 0.0,
                "ready": 0.0,
                "released": 0.0,
                "busy": [],
                "events": [],
                "cost": 0.0,
            },
            {
                "name": "prefill",
                "kind": "prefill",
                "resources": {"GPU": 1},
                "requested": 0.0,
                "started": 0.0,
                "ready": 0.3,
                "released": prefill_end,
                "busy": [[0.3, prefill_end]],
                "events": [],
                "cost": RHO * prefill_end,
            },
        ]
        decode = []
        for a, group in enumerate(groups):
            start = 0.05 * a
            ready = start + (0.0 if a == 0 else cold)
            work = 1.0 + TPOT * max(group_max[u] for u in group) * (1 + 0.15 * len(group))
            decode.append(
                {
                    "name": f"decode-{a}",
                    "kind": "decode",
                    "resources": {"GPU": 1},
                    "requested": start,
                    "started": start + 0.1,
                    "ready": ready + 0.1,
                    "busy": [[max(ready + 0.1, prefill_end), max(ready + 0.1, prefill_end) + work]],
                    "events": [],
                    "node": NODES[a % 2],  # every other one beside the learner
                }
            )
        gen_end = max(d["busy"][-1][1] for d in decode)
        slowest = max(decode, key=lambda x: x["busy"][-1][1])
        start, end = slowest["busy"][0][0], slowest["busy"][-1][1]
        cut = start + TAU * (end - start)
        running = [x for x in decode if x is not slowest and x["busy"][-1][1] > cut + 0.2]
        if planner and running:
            # The slowest actor is cut at tau; its stragglers finish on a still-running actor's free slots.
            target = min(running, key=lambda x: x["busy"][-1][1])
            slowest["events"] = [{"t": cut, "kind": "cut", "n": 2}, {"t": cut, "kind": "migrate_out", "n": 2}]
            slowest["busy"][-1][1] = cut
            target["events"].append({"t": cut + 0.2, "kind": "migrate_in", "n": 2})
            target["busy"][-1][1] = max(target["busy"][-1][1], end - 0.5)
        for d in decode:
            d["released"] = (d["busy"][-1][1] if planner else gen_end) + 0.2
        gen_end = max(d["released"] for d in decode)
        for d in decode:
            d["cost"] = RHO * (d["released"] - d["started"])
        prep_end = gen_end + 2.0
        learn_end = prep_end + 6.0
        functions[0].update(released=learn_end, busy=[[prep_end, learn_end]], cost=RHO * learn_end)
        functions += decode
        functions += [
            {
                "name": "reference",
                "kind": "reference",
                "resources": {"GPU": 1},
                "requested": gen_end,
                "started": gen_end,
                "ready": gen_end + 0.5,
                "released": prep_end,
                "busy": [[gen_end + 0.5, prep_end]],
                "events": [],
                "cost": RHO * (prep_end - gen_end),
            },
            {
                "name": "reward",
                "kind": "reward",
                "resources": {"CPU": 1},
                "requested": gen_end,
                "started": gen_end,
                "ready": gen_end,
                "released": gen_end + 0.4,
                "busy": [[gen_end, gen_end + 0.4]],
                "events": [],
                "cost": 0.0,
            },
        ]
        if runtime:
            for f in functions:
                f.setdefault("node", NODES[0])
            nodes = [
                {"node": NODES[0], "address": "10.0.0.1", "slots": 2, "free": 2, "driver": True},
                {"node": NODES[1], "address": "10.0.0.2", "slots": 2, "free": 2, "driver": False},
            ]
            transfers = [
                {
                    "kind": kind,
                    "source": source,
                    "target": d["name"],
                    "bytes": nbytes,
                    "seconds": seconds * (1 if d["node"] == NODES[0] else 10),
                    "same_node": d["node"] == NODES[0],
                    "start": d["ready"],
                }
                for d in decode
                for kind, source, nbytes, seconds in (
                    ("weights", "learner", 4e6, 0.01),
                    ("kv", "prefill", 2e5, 0.002),
                )
            ]
            timeline = {"step": step, "nodes": nodes, "functions": functions, "transfers": transfers}
            (path / "timeline" / f"step_{step:06d}.json").write_text(json.dumps(timeline))
        if planner:
            plan = {
                "n_actors": n,
                "prefix_length": 12,
                "unique_prefixes": prompts,
                "actors": [
                    {"uids": g, "gpus": 1, "node": 0, "predicted_time": 1.0, "predicted_cost": 1.0}
                    for g in groups
                ],
                "candidates": candidates,
                "plan_seconds": 0.004 + 0.001 * step,
                "policy": "rlhfless",
                "time_cap": 1.05 * next(c["time"] for c in candidates if c["n"] == n),
            }
            (path / "plans" / f"step_{step:06d}.json").write_text(json.dumps(plan))

        all_lengths = [x for v in lengths.values() for x in v]
        rewards = [x["reward"] for x in lines]
        m = {
            "step": step,
            "reward/mean": float(np.mean(rewards)),
            "reward/std": float(np.std(rewards)),
            "response_length/mean": float(np.mean(all_lengths)),
            "response_length/max": float(max(all_lengths)),
            "kl/mean": 0.001 * step**1.5,
            "loss/policy": 0.5 / step - 0.1,
            "grad_norm": 1.0 / step,
            "time/step": learn_end + 0.3,
            "time/generation": gen_end,
            "time/preparation": prep_end - gen_end,
            "time/learning": learn_end - prep_end,
            "time/reward": 0.4,
            "time/reference": prep_end - gen_end - 0.4,
        }
        if engine:
            m |= {
                "prefill/tokens_computed": 900.0,
                "prefill/tokens_naive": 3600.0,
                "time/prefill": prefill_end,
                "time/decode": gen_end - prefill_end,
            }
        if runtime:
            cost_gen = sum(d["cost"] for d in decode) + functions[1]["cost"]
            m |= {
                "cost/step": sum(f["cost"] for f in functions),
                "cost/generation": cost_gen,
                "cost/learning": functions[0]["cost"],
                "actors/decode": float(n),
                "actors/cold_starts": float(n - 1 if step == 1 else 0),
                "migrations": 2.0 if planner else 0.0,
                "time/weight_sync": 0.3,
                "time/kv_transfer": 0.1 if planner else 0.0,
                "bytes/weight_sync": 2.7e8,
                "bytes/kv_transfer": 1.0e6,
                # Function-seconds summed over invocations, not wall time: never a phase.
                "time/cold_start": sum(f["ready"] - f["started"] for f in functions),
                "time/idle": 50.0,
                "time/billed": 120.0,
            }
        if planner:
            chosen = next(c for c in candidates if c["n"] == n)
            m |= {
                "plan/n_actors": float(n),
                "time/plan": 0.004 + 0.001 * step,
                "plan/predicted_time": chosen["time"],
                "plan/predicted_cost": chosen["cost"],
                "predictor/mae": 20.0,
                "predictor/within_50": 0.8,
                "predictor/kendall_tau": 0.6,
            }
        if planner and runtime:  # the forecast the plan made, a little off what was measured
            m |= {
                "forecast/generation_time": 1.1 * m["time/generation"],
                "forecast/generation_cost": 0.7 * m["cost/generation"],
                "forecast/step_time": 0.95 * m["time/step"],
                "forecast/step_cost": 1.05 * m["cost/step"],
                "floor/generation_s": 0.5 * m["time/generation"],
                "floor/work_cost": 0.25 * m["cost/generation"],
                "floor/time_over": 2.0,
                "floor/cost_over": 4.0,
                "prefill/tree_ratio": 1.0,
                "time/prep_overlapped": 0.25,
            }
        if ppo:
            m |= {"loss/value": 0.3 / step, "value/mean": 0.1 * step, "value/explained_variance": 0.2}
        metrics.append(m)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if planner and runtime:
        forecast = {
            "steps": steps,
            "time_s": 1.2 * sum(m["time/step"] for m in metrics),
            "cost": 0.9 * sum(m["cost/step"] for m in metrics),
            "time_range_s": [1.0, 1e4],
            "cost_range": [0.0, 1.0],
            "per_step": [{"step": m["step"]} for m in metrics],
            "pilot/prompts": 5.0,
            "pilot/seconds": 12.5,
            "pilot/cost": 0.0068,
        }
        (path / "forecast.json").write_text(json.dumps(forecast))
    (path / "summary.json").write_text(
        json.dumps(
            {
                "steps": steps,
                "mean_step_time": float(np.mean([m["time/step"] for m in metrics])),
                "first_reward": metrics[0]["reward/mean"],
                "last_reward": metrics[-1]["reward/mean"],
            }
        )
    )
    return path
