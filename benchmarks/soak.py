"""Soak: real training steps under random faults, compared with an undisturbed run of the same seed.

1. The undisturbed run: `python -m rlhfless train --preset tiny runtime.executor=ray` for --steps
   steps, two decode functions a step (one colocated with the learner, one on its own slot).
2. The faulty run, same seed: functions killed and slowed at random (`runtime.fault_schedule`,
   rate --faults: decode and prepare functions exit or sleep), the driver killed with -9 at random
   moments (--driver-kills: after a random step, a random fraction of a step later) and inside
   checkpoint writes (--checkpoint-kills: `runtime.faults` `checkpoint_exit` after a random file),
   each time resumed with `--resume` until every step is done. --nodes 2 runs both on a
   two-raylet `ray.cluster_utils.Cluster` and adds `node_exit` faults (a worker node's raylet
   killed mid-step; the soak adds a new worker node while the run goes on). For CI:
   --functions 1, --shared-ray (the faulty launches on one Ray the soak starts) and --parallel
   (the undisturbed run beside the faulty one) cut its cost.
3. Compared: every sample of `rollouts/` (lost: missing; changed: any field differs) and the
   learning metrics of `metrics.jsonl` (equal within 1e-6 relative).
4. Measured by a sampling thread: resident memory of the driver and of the Ray functions
   (per function) and open file handles; Ray's object store at the end of every step, as the run
   logs it (`ray/object_store_mib`, `ray/object_store_objects` in metrics.jsonl);
   growth after warm-up. Then the simulator (`rlhfless simulate`'s step loop) for --sim-steps
   steps, in its own process, its resident memory per step.

Prints a table and writes a JSON summary (--json). Run: python benchmarks/soak.py --steps 40 --faults 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from rlhfless.faults import CHECKPOINT_FILES, SCHEDULABLE, SCHEDULED, FaultSchedule

ROOT = Path(__file__).resolve().parents[1]
# Learning metrics a resumed, faulty run must reproduce exactly (timing and cost ones differ).
COMPARED = (
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "response_length/max",
    "kl/mean",
    "loss/policy",
    "grad_norm",
    "actor/clip_frac",
    "actor/approx_kl",
)
SAMPLE_FIELDS = ("prompt_ids", "response", "response_tokens", "reward", "finish_reason")
RAY_SERVICES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
KILLED = (-signal.SIGKILL, 137)  # killed by us, or by its own checkpoint_exit fault


def base_overrides(args, out: Path, address: str | None) -> list[str]:
    over = [
        "--preset",
        "tiny",
        f"output_dir={out}",
        f"seed={args.seed}",
        f"trainer.steps={args.steps}",
        "trainer.save_every=1",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        "runtime.executor=ray",
        "runtime.slice_s=0.02",
    ]
    if address:
        over.append(f"runtime.ray_address={address}")
    if args.functions:
        return [*over, f"scheduler.n_min={args.functions}", f"scheduler.n_max={args.functions}"]
    if args.nodes == 2:  # a function on every slot of the cluster, the worker node's included
        return [*over, "scheduler.n_min=8"]
    return [*over, "scheduler.n_min=2"]  # one decode function colocated with the learner, one on its own slot


# ----- sampling ------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Samples the training process tree every `period` s, and the functions the raylets of
    `cluster` started (a launch's functions on a cluster are not its descendants)."""

    run_dir: Path
    cluster: LocalCluster | None = None
    period: float = 0.1
    rows: list[dict] = field(default_factory=list)
    proc: psutil.Process | None = None
    tree: set[psutil.Process] = field(default_factory=set)  # every descendant of `proc` seen
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        try:
            return path.read_bytes().count(b"\n")
        except OSError:
            return 0

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            proc = self.proc
            row = None if proc is None else self._sample(proc)
            if row is not None:
                self.rows.append(row)

    def _sample(self, proc: psutil.Process) -> dict | None:
        try:
            with proc.oneshot():
                row = {
                    "t": time.time(),
                    "pid": proc.pid,
                    "rss": proc.memory_info().rss,
                    "fds": proc.num_fds(),
                }
            kids = proc.children(recursive=True)
        except psutil.Error:
            return None
        self.tree.update(kids)
        for pid in self.cluster.raylets() if self.cluster else []:
            try:
                kids += psutil.Process(pid).children(recursive=True)
            except psutil.Error:
                pass
        rss, fds, n = 0, 0, 0
        for kid in kids:
            try:
                name = kid.name()
                if not name.startswith("ray::") or name.startswith(RAY_SERVICES):
                    continue
                rss, fds, n = rss + kid.memory_info().rss, fds + kid.num_fds(), n + 1
            except psutil.Error:
                continue
        return row | {"functions": n, "functions_rss": rss, "functions_fds": fds, "step": self._steps()}


def per_step(rows: list[dict], key: str, per: str | None = None) -> dict[int, float]:
    """`key` (divided by `per`, e.g. per function) as last sampled while each step was the latest logged."""
    out = {}
    for r in rows:
        if not per or r[per]:
            out[r["step"]] = r[key] / r[per] if per else r[key]
    return out


def growth(rows: list[dict], key: str, warm_step: int, last_step: int, per: str | None = None) -> dict | None:
    """Relative growth of `key` from step `warm_step` to step `last_step` - 1 (the last step's
    samples include the shutdown), each the median of its neighbourhood of steps."""
    values = per_step(rows, key, per)
    steps = [k for k in sorted(values) if warm_step <= k < last_step]
    if len(steps) < 3:
        return None
    k = max(1, len(steps) // 5)
    first = statistics.median(values[s] for s in steps[:k])
    last = statistics.median(values[s] for s in steps[-k:])
    return {
        "first": first,
        "last": last,
        "growth": last / first - 1 if first else 0.0,
        "steps": [steps[0], steps[-1]],
        "max": max(values[s] for s in steps),
    }


# ----- launching -----------------------------------------------------------------------------


@dataclass
class Launch:
    overrides: list[str]
    kill_after_step: int | None = None  # the harness kills -9 once this many steps are logged...
    kill_delay_s: float = 0.0  # ...this much later
    checkpoint_exit: tuple[int, str] | None = None  # (step, file): the run's own fault
    faults: list[dict] = field(default_factory=list)  # more of `runtime.faults` (node_exit)
    outlived: list[str] = field(default_factory=list)  # its processes alive 10 s after it ended (stopped)


def run_launch(cmd: list[str], launch: Launch, sampler: Sampler, log: Path) -> tuple[int, float]:
    """One training process to its end (or its kill); every process it left behind is stopped.
    A worker node of the cluster that a `node_exit` fault took is replaced while it runs."""
    listed = list(launch.faults)
    if launch.checkpoint_exit:
        step, file = launch.checkpoint_exit
        listed.append({"kind": "checkpoint_exit", "step": step, "file": file})
    extra = [f"runtime.faults={json.dumps(listed)}"] if listed else []
    start = time.time()
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(cmd + launch.overrides + extra)}\n")
        handle.flush()
        proc = subprocess.Popen(cmd + launch.overrides + extra, stdout=handle, stderr=subprocess.STDOUT)
    sampler.tree = set()
    sampler.proc = psutil.Process(proc.pid)
    while proc.poll() is None:
        if sampler.cluster is not None:
            sampler.cluster.heal()
        if (
            launch.kill_after_step is not None
            and logged_since(sampler.run_dir, start) >= launch.kill_after_step
        ):
            time.sleep(launch.kill_delay_s)
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    rc = proc.wait()
    sampler.proc = None
    launch.outlived = _reap(sampler.tree)
    return rc, time.time() - start


def _reap(tree: set[psutil.Process]) -> list[str]:
    """Processes a killed driver started (its embedded Ray) that outlived it by 10 s: stopped by
    pid, and counted."""
    deadline = time.time() + 10

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    alive = [p for p in tree if running(p)]
    while alive and time.time() < deadline:
        time.sleep(0.5)
        alive = [p for p in alive if running(p)]
    names = []
    for p in alive:
        try:
            names.append(p.name())
            p.kill()
        except psutil.Error:
            pass
    return sorted(names)


def logged_since(run_dir: Path, since: float) -> int:
    """Steps in metrics.jsonl, once this launch has rewritten it (a resume truncates it first;
    until then the lines are the killed launch's): 0 before."""
    path = run_dir / "metrics.jsonl"
    try:
        if path.stat().st_mtime < since:
            return 0
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def checkpointed(run_dir: Path) -> int:
    """The step of the run's latest complete checkpoint (0: none)."""
    done = [p.name for p in (run_dir / "checkpoints").glob("step_*") if (p / "trainer_state.json").exists()]
    return max((int(name.removeprefix("step_")) for name in done), default=0)


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # cut short by the kill
    return out


def interruptions(steps: int, driver_kills: int, checkpoint_kills: int, seed: int) -> list[Launch]:
    """The faulty run's launches: one interruption each, at increasing steps, then one to finish."""
    rng = np.random.default_rng([seed, 9])
    count = min(steps - 1, driver_kills + checkpoint_kills)
    at = sorted(rng.choice(np.arange(1, steps), size=count, replace=False).tolist()) if count else []
    kinds = ["checkpoint"] * min(checkpoint_kills, count) + ["driver"] * (
        count - min(checkpoint_kills, count)
    )
    rng.shuffle(kinds)
    launches = []
    for step, kind in zip(at, kinds, strict=True):
        if kind == "checkpoint":  # exits inside the write of step `step`'s checkpoint
            file = CHECKPOINT_FILES[int(rng.integers(len(CHECKPOINT_FILES)))]
            launches.append(Launch([], checkpoint_exit=(int(step), file)))
        else:  # -9 a random part of a step after step `step` was logged
            launches.append(Launch([], kill_after_step=int(step), kill_delay_s=float(rng.uniform(0, 0.6))))
    return [*launches, Launch([])]


# ----- comparing -----------------------------------------------------------------------------


def read_rollouts(run_dir: Path, steps: int) -> dict[tuple[int, str, int], tuple]:
    out = {}
    for step in range(1, steps + 1):
        path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out[(step, r["uid"], r["sample"])] = tuple(json.dumps(r[k]) for k in SAMPLE_FIELDS)
    return out


def compare(clean: Path, faulty: Path, steps: int) -> dict:
    want, got = read_rollouts(clean, steps), read_rollouts(faulty, steps)
    lost = sorted(set(want) - set(got))
    changed = sorted(k for k in want if k in got and want[k] != got[k]) + sorted(set(got) - set(want))
    a, b = {r["step"]: r for r in rows_of(clean)}, {r["step"]: r for r in rows_of(faulty)}
    worst, unequal = 0.0, []
    for step in range(1, steps + 1):
        for key in COMPARED:
            x, y = a.get(step, {}).get(key), b.get(step, {}).get(key)
            if x is None and y is None:
                continue
            if x is None or y is None:
                unequal.append((step, key))
                continue
            rel = abs(x - y) / max(abs(x), 1e-12)
            worst = max(worst, rel if abs(x - y) > 1e-9 else 0.0)
            if abs(x - y) > 1e-6 * abs(x) + 1e-9:
                unequal.append((step, key))
    return {
        "samples": len(want),
        "samples_lost": len(lost),
        "samples_changed": len(changed),
        "metric_steps": sorted(b),
        "metrics_equal": not unequal and sorted(a) == sorted(b) == list(range(1, steps + 1)),
        "metrics_unequal": unequal[:10],
        "metrics_max_rel_diff": worst,
        "lost_examples": [list(k) for k in lost[:5]],
        "changed_examples": [list(k) for k in changed[:5]],
    }


# ----- the runs ------------------------------------------------------------------------------


def train_cmd() -> list[str]:
    return [sys.executable, "-m", "rlhfless", "train"]


def clean_run(args, out: Path, cluster: LocalCluster | None) -> dict:
    sampler = Sampler(out / "clean", cluster)
    sampler.start()
    launch = Launch(base_overrides(args, out / "clean", cluster and cluster.address))
    rc, wall = run_launch(train_cmd(), launch, sampler, out / "clean.log")
    sampler.stop()
    if rc != 0:
        raise SystemExit(f"soak: the undisturbed run failed (exit {rc}); see {out / 'clean.log'}")
    return {"wall_s": wall, "rows": sampler.rows}


def faulty_run(args, out: Path, cluster: LocalCluster | None) -> dict:
    run_dir = out / "faulty"
    schedule = {"seed": args.seed, "rate": args.faults, "kinds": list(args.kinds)}
    extra = [f"runtime.fault_schedule={json.dumps(schedule)}"]
    launches = interruptions(args.steps, args.driver_kills, args.checkpoint_kills, args.seed)
    sampler = Sampler(run_dir, cluster)
    sampler.start()
    injected = {"functions": 0, "node_exit": 0, "driver_kill": 0, "checkpoint_exit": 0}
    records, resumed = [], False
    node_faults = node_fault_overrides(args) if args.nodes == 2 else []
    for i, launch in enumerate(launches):
        start = checkpointed(run_dir)  # the step this launch resumes after
        if launch.kill_after_step is not None:  # a step this launch runs
            launch.kill_after_step = max(launch.kill_after_step, start + 1)
        launch.overrides = base_overrides(args, run_dir, cluster and cluster.address) + extra
        launch.faults = node_faults
        if resumed:  # before the overrides: argparse takes no option after them
            launch.overrides.insert(0, "--resume")
        replaced = cluster.replaced if cluster else 0
        rc, wall = run_launch(train_cmd(), launch, sampler, out / "faulty.log")
        if cluster is not None:  # a node its last step's fault took
            cluster.heal()
        nodes = cluster.replaced - replaced if cluster else 0  # their decode function counts it too
        ran = [r for r in rows_of(run_dir) if r["step"] > start]
        fired = sum(int(r.get("faults/injected", 0)) + int(r.get("faults/prepare_injected", 0)) for r in ran)
        injected["functions"] += fired - nodes
        injected["node_exit"] += nodes
        kind = (
            "checkpoint_exit" if launch.checkpoint_exit else "driver_kill" if launch.kill_after_step else None
        )
        if rc in KILLED and kind:
            injected[kind] += 1
        elif rc != 0:
            raise SystemExit(f"soak: launch {i + 1} failed (exit {rc}); see {out / 'faulty.log'}")
        records.append(
            {
                "launch": i + 1,
                "exit": rc,
                "wall_s": wall,
                "interruption": kind,
                "steps_logged": len(ran),
                "processes_outlived": launch.outlived,
            }
        )
        resumed = True
        if rc == 0:
            break
    sampler.stop()
    planned = FaultSchedule(seed=args.seed, rate=args.faults, kinds=tuple(args.kinds))
    scheduled = sum(len(planned.at(s)) for s in range(1, args.steps + 1))
    return {
        "launches": records,
        "injected": injected,
        "scheduled_function_faults": scheduled,
        "rows": sampler.rows,
    }


def node_fault_overrides(args) -> list[dict]:
    """--nodes 2: a worker node's raylet killed mid-step, at seeded steps."""
    rng = np.random.default_rng([args.seed, 7])
    steps = sorted(
        rng.choice(np.arange(2, args.steps + 1), size=min(args.node_kills, args.steps - 1), replace=False)
    )
    return [{"kind": "node_exit", "step": int(s), "node": 1, "after": 2} for s in steps]


class LocalCluster:
    """A Ray cluster on this machine (`ray.cluster_utils.Cluster`) that the launches connect to:
    one node (--shared-ray), offering the CPUs an embedded Ray would (all cores but the
    learner's), or two raylets of one CPU each (--nodes 2), the head (the driver's node) and a
    worker that `node_exit` faults kill; `heal` adds a new worker when it is gone."""

    def __init__(self, nodes: int) -> None:
        from ray.cluster_utils import Cluster

        self.nodes = nodes
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1 if nodes == 2 else max(1, (os.cpu_count() or 1) - 1),
                "include_dashboard": False,
                "_system_config": {"health_check_period_ms": 200, "health_check_failure_threshold": 3},
            },
        )
        if nodes == 2:
            self.cluster.add_node(num_cpus=1)
        self.address = self.cluster.address
        self.replaced = 0  # worker nodes replaced after a node_exit

    def raylets(self) -> list[int]:
        """Pids of the nodes' raylets (the parents of their functions)."""
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        return [info.process.pid for node in nodes for info in node.all_processes.get("raylet", [])]

    def heal(self) -> None:
        """A worker node whose raylet is gone (a `node_exit` fault) is removed and a new one added,
        as an autoscaler would: the run's next plan places functions on it again."""
        for node in list(self.cluster.worker_nodes):
            raylet = node.all_processes.get("raylet", [])
            if raylet and raylet[0].process.poll() is not None:
                self.cluster.remove_node(node, allow_graceful=False)
                self.cluster.add_node(num_cpus=1)
                self.replaced += 1

    def close(self) -> None:
        self.cluster.shutdown()


def sim_soak(steps: int) -> dict:
    """The simulator's step loop (`rlhfless simulate`'s) for `steps` steps; resident memory per step."""
    from rlhfless.planner.predictor import LengthPredictor
    from rlhfless.sim.config import build
    from rlhfless.sim.presets import preset
    from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, scheduler_for
    from rlhfless.sim.step import Simulator

    _, tree = preset("paper-physical")[0]
    cfg = build(tree)
    stage, workload = make_stage(cfg), make_workload(cfg)
    config = scheduler_for(cfg, VARIANTS["rlhfless"])
    sim = Simulator(stage, config, LengthPredictor.from_config(config))
    me = psutil.Process()
    rows, start = [], time.time()
    for k in range(steps):
        prompts = workload.step(k)
        plan = sim.plan(prompts)
        sim.execute(k, prompts, plan)
        sim.predictor.update_many(prompts.uids, prompts.lengths)
        rows.append({"step": k + 1, "rss": me.memory_info().rss, "fds": me.num_fds()})
    return {"steps": steps, "wall_s": time.time() - start, "rows": rows}


# ----- report --------------------------------------------------------------------------------


def summarise(args, clean: dict, faulty: dict, diff: dict, sim: dict | None) -> dict:
    warm = max(2, args.steps // 5)
    fmt = {
        "driver_rss": growth(clean["rows"], "rss", warm, args.steps),
        "function_rss": growth(clean["rows"], "functions_rss", warm, args.steps, per="functions"),
        "functions_rss_total": growth(clean["rows"], "functions_rss", warm, args.steps),
        "driver_fds": growth(clean["rows"], "fds", warm, args.steps),
        "function_fds": growth(clean["rows"], "functions_fds", warm, args.steps, per="functions"),
    }
    store = [
        {"step": r["step"], "mib": r["ray/object_store_mib"], "objects": r["ray/object_store_objects"]}
        for r in rows_of(Path(args.out) / "clean")
        if "ray/object_store_mib" in r
    ]
    after = [s for s in store if s["step"] >= warm]
    injected = faulty["injected"]
    total = sum(injected.values())
    completed = max((r["step"] for r in rows_of(Path(args.out) / "faulty")), default=0)
    survived = total if completed == args.steps and diff["samples_lost"] == 0 else 0
    summary = {
        "steps": args.steps,
        "seed": args.seed,
        "fault_rate": args.faults,
        "steps_completed": completed,
        "faults_injected": total,
        "faults_by_kind": injected,
        "faults_survived": survived,
        "scheduled_function_faults": faulty["scheduled_function_faults"],
        "launches": faulty["launches"],
        **{k: v for k, v in diff.items() if k != "metric_steps"},
        "memory": fmt,
        "object_store": {
            "samples": len(store),
            "first_mib": after[0]["mib"] if after else None,
            "last_mib": after[-1]["mib"] if after else None,
            "max_mib": max((s["mib"] for s in after), default=None),
            "first_objects": after[0]["objects"] if after else None,
            "last_objects": after[-1]["objects"] if after else None,
            "series": store,
        },
        "clean_wall_s": clean["wall_s"],
        "faulty_wall_s": sum(r["wall_s"] for r in faulty["launches"]),
        "warm_up_steps": warm,
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    if sim is not None:
        sim_warm = max(2, sim["steps"] // 5)
        summary["sim"] = {
            "steps": sim["steps"],
            "wall_s": sim["wall_s"],
            "rss": growth(sim["rows"], "rss", sim_warm, sim["steps"] + 1),
            "fds": growth(sim["rows"], "fds", sim_warm, sim["steps"] + 1),
        }
    step_times = [r["time/step"] for r in rows_of(Path(args.out) / "clean") if r["step"] > 1]
    summary["clean_step_s_median"] = statistics.median(step_times) if step_times else None
    return summary


def _pct(g: dict | None) -> str:
    return (
        "n/a (too few samples)"
        if g is None
        else f"{100 * g['growth']:+.1f}% ({g['first'] / 2**20:.0f} -> {g['last'] / 2**20:.0f} MiB)"
    )


def _store(store: dict) -> str:
    if not store["samples"]:
        return "not logged"
    return (
        f"{store['first_mib']:.2f} -> {store['last_mib']:.2f} MiB (max {store['max_mib']:.2f}), "
        f"{store['first_objects']:.0f} -> {store['last_objects']:.0f} objects, {store['samples']} steps"
    )


def table(s: dict) -> str:
    mem = s["memory"]
    store = s["object_store"]
    fds = mem["driver_fds"], mem["function_fds"]
    lines = [
        ("steps completed", f"{s['steps_completed']} / {s['steps']}"),
        (
            "faults injected",
            f"{s['faults_injected']} {s['faults_by_kind']} (schedule drew {s['scheduled_function_faults']})",
        ),
        ("faults survived", str(s["faults_survived"])),
        ("samples lost", f"{s['samples_lost']} of {s['samples']}"),
        ("samples changed", f"{s['samples_changed']} of {s['samples']}"),
        ("metrics equal", f"{s['metrics_equal']} (max rel diff {s['metrics_max_rel_diff']:.1e})"),
        ("memory growth, driver", _pct(mem["driver_rss"])),
        ("memory growth, per function", _pct(mem["function_rss"])),
        (
            "memory growth, simulator",
            _pct(s["sim"]["rss"]) + f" over {s['sim']['steps']} steps" if "sim" in s else "not run",
        ),
        ("object store (end of step)", _store(store)),
        (
            "open fds (driver, per function)",
            " / ".join("n/a" if g is None else f"{g['first']:.0f} -> {g['last']:.0f}" for g in fds),
        ),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--faults", type=float, default=0.2, help="function faults per step (probability)")
    parser.add_argument("--driver-kills", type=int, help="kill -9 of the driver (default: steps // 10, >= 1)")
    parser.add_argument(
        "--checkpoint-kills", type=int, default=1, help="driver exits inside a checkpoint write"
    )
    parser.add_argument(
        "--nodes", type=int, choices=(1, 2), default=1, help="2: a two-raylet cluster, node faults"
    )
    parser.add_argument("--node-kills", type=int, default=1, help="--nodes 2: worker raylets killed")
    parser.add_argument(
        "--kinds",
        type=lambda text: text.split(","),
        help=f"the schedule's kinds, of {','.join(SCHEDULABLE)} (default: the first four; "
        "--nodes 2: node_exit too)",
    )
    parser.add_argument(
        "--functions", type=int, help="decode functions a step (default: 2; --nodes 2: one per slot)"
    )
    parser.add_argument(
        "--shared-ray",
        action="store_true",
        help="the launches connect to one Ray the soak starts, instead of each starting its own",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="the undisturbed run runs beside the faulty one, on a Ray of its own, not before it",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sim-steps", type=int, default=300, help="simulated steps (0: skip)")
    parser.add_argument("--out", help="keep both run directories here (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="write the summary here (default OUT/soak.json)")
    parser.add_argument("--sim-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sim_only:
        print(json.dumps(sim_soak(args.sim_steps)))
        return 0
    if args.driver_kills is None:
        args.driver_kills = max(1, args.steps // 10)
    if args.kinds is None:
        args.kinds = [*SCHEDULED, "node_exit"] if args.nodes == 2 else list(SCHEDULED)
    if bad := [k for k in args.kinds if k not in SCHEDULABLE]:
        parser.error(f"--kinds: got {bad[0]!r}, expected some of {','.join(SCHEDULABLE)}")
    if args.parallel and args.nodes == 2:
        parser.error("--parallel: the undisturbed run needs a Ray of its own; --nodes 2 shares one")
    keep = args.out is not None
    args.out = args.out or tempfile.mkdtemp(prefix="rlhfless-soak-")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    cluster = LocalCluster(args.nodes) if args.nodes == 2 or args.shared_ray else None
    try:
        if args.parallel:
            with ThreadPoolExecutor(1) as pool:
                beside = pool.submit(clean_run, args, out, None)
                faulty = faulty_run(args, out, cluster)
                clean = beside.result()
        else:
            clean = clean_run(args, out, cluster)
            faulty = faulty_run(args, out, cluster)
    finally:
        if cluster is not None:
            cluster.close()
    diff = compare(out / "clean", out / "faulty", args.steps)
    sim = None
    if args.sim_steps:
        done = subprocess.run(
            [sys.executable, __file__, "--sim-only", "--sim-steps", str(args.sim_steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        sim = json.loads(done.stdout.strip().splitlines()[-1])
    summary = summarise(args, clean, faulty, diff, sim)
    path = args.json or out / "soak.json"
    path.write_text(json.dumps(summary, indent=1))
    print(table(summary))
    print(f"\nsummary: {path}" + ("" if keep else " (run directories removed)"))
    if not keep:
        shutil.rmtree(out / "clean", ignore_errors=True)
        shutil.rmtree(out / "faulty", ignore_errors=True)
    ok = summary["samples_lost"] == 0 and summary["samples_changed"] == 0 and summary["metrics_equal"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
