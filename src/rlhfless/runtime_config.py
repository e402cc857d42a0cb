"""The `runtime.` config section: which executor runs the step's functions, and how Ray runs them.

It sits beside `config.py`, not inside `runtime/`, so that configs flow one way: the run config
imports no module of the runtime that consumes it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rlhfless.checks import check
from rlhfless.faults import FaultPlan, describe, parse_faults

EXECUTORS = ("ray", "inprocess")
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class RuntimeConfig:
    """Where generation, preparation and learning run, and how serverless functions are kept."""

    executor: str = field(
        default="ray",
        metadata={
            "help": f"step executor: one of {', '.join(EXECUTORS)} (ray: serverless functions; "
            "inprocess: everything in this process, for debugging)"
        },
    )
    device: str = field(
        default="auto",
        metadata={
            "help": f"where every model and its KV live: one of {', '.join(DEVICES)} (auto: cuda when "
            "torch sees a GPU, else cpu); chosen once when the run starts, with model.dtype=auto "
            "giving bfloat16 on cuda and float32 on cpu"
        },
    )
    ray_address: str | None = field(
        default=None,
        metadata={
            "help": "Ray cluster to connect to (e.g. 127.0.0.1:6379, or auto inside `ray job submit`); "
            "null starts an embedded local Ray. The planner reads its nodes and free resources each step"
        },
    )
    num_cpus: int = field(
        default=0, metadata={"help": "embedded Ray: CPUs of this machine to use; 0 = every core"}
    )
    cpus_per_actor: int = field(
        default=1,
        metadata={"help": "CPU-only machines: CPU slot of one decode function (stands in for its GPUs)"},
    )
    threads_per_actor: int = field(default=1, metadata={"help": "torch threads inside each function"})
    learner_width: int = field(
        default=0,
        metadata={
            "help": "ray executor: data-parallel learner ranks for the learning phase, one slot each, "
            "billed per slot while held; 0 = the planner's choice among the slots free after "
            "generation (the learner's own and those the decode functions released): all of them "
            "until a phase was measured, then the lam score of learning time against its cost, rank "
            "starts included (under scheduler.budget_per_step or deadline_per_step, the step plan's "
            "width); 1 = the learner alone. Extra ranks are requested once generation's "
            "live forecast is within one measured rank start"
        },
    )
    keep_alive_s: float = field(
        default=300.0,
        metadata={"help": "seconds a released function stays warm for reuse before it is stopped"},
    )
    slice_s: float = field(
        default=0.2,
        metadata={"help": "decode time slice between progress reports (granularity of cuts and faults)"},
    )
    place_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "seconds Ray may take to place a new function (start its process on its node; "
            "loading its model may run longer) before it is stopped and its sequences are placed "
            "again elsewhere (its node is gone, or another job took the resources)"
        },
    )
    migrate_kv: bool = field(
        default=True,
        metadata={"help": "migrated sequences carry their KV cache (else the target re-prefills them)"},
    )
    faults: list[Any] = field(
        default_factory=list,
        metadata={
            "help": "ray executor: injected faults, each a mapping of kind, step and its target and "
            "point, e.g. [{kind: decode_exit, step: 2, actor: 0, after: 3}]; kinds: " + describe()
        },
    )
    fault_schedule: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "ray executor: random faults, the same for the same seed: {seed: 0, rate: 0.2, "
            "kinds: [decode_exit, slow, prepare_exit, prepare_slow], max_after: 8, max_seconds: 2}; "
            "at each step, with probability rate, one fault of a kind drawn from kinds (a decode "
            "function's taken modulo the step's plan size; node_exit may be listed too: plan node 1's); "
            "{} = none"
        },
    )
    profile: str | None = field(
        default=None,
        metadata={
            "help": "the planner's time table: a file from `rlhfless profile --output FILE`; null "
            "measures this machine once (decode and prefill times, and a function's cold start) and "
            "caches it under model.cache_dir/profiles/; 'derived' derives one from the model's shape "
            "(rough on CPUs)"
        },
    )
    speed_probe: bool = field(
        default=True,
        metadata={
            "help": "time three decode steps of the model's cached time table as the run starts and "
            "scale the table, the cached learning rate and the run memory by how much slower or "
            "faster this machine is now than when they were measured (a shared host's speed drifts "
            "by the hour); false keeps the cached figures as they are"
        },
    )
    calibration_memory: bool = field(
        default=True,
        metadata={
            "help": "start the forecast's time model from what earlier runs of this model on this "
            "machine learned at the same learning width and scheduling policy (cached beside the "
            "profile), instead of from the profile alone"
        },
    )
    dashboard: bool = field(default=False, metadata={"help": "embedded Ray: start the dashboard"})
    learner_mmap_threshold: int = field(
        default=0,
        metadata={
            "help": "ray executor: glibc's MALLOC_MMAP_THRESHOLD_ in bytes for the learner's rank "
            "processes (set through Ray's runtime_env env_vars), e.g. 65536 on a machine short of "
            "memory: every block at least this large is mapped on its own and unmapped when freed, "
            "so freed activations no longer stay in a fragmented heap (a rank's peak was 0.46 GB "
            "lower, its step's CPU time 23% longer: docs/DECISIONS.md); 0 (the default) keeps "
            "glibc's sliding threshold"
        },
    )

    def slots(self) -> int:
        """Actor slots (the learner's included) this machine offers: the planner's cluster size."""
        if self.executor == "inprocess":
            return 1
        return max(1, (self.num_cpus or os.cpu_count() or 1) // self.cpus_per_actor)

    def __post_init__(self) -> None:
        check(self.executor in EXECUTORS, "executor", self.executor, f"one of {', '.join(EXECUTORS)}")
        check(self.device in DEVICES, "device", self.device, f"one of {', '.join(DEVICES)}")
        check(self.num_cpus >= 0, "num_cpus", self.num_cpus, "an integer >= 0")
        check(self.cpus_per_actor >= 1, "cpus_per_actor", self.cpus_per_actor, "an integer >= 1")
        check(self.threads_per_actor >= 1, "threads_per_actor", self.threads_per_actor, "an integer >= 1")
        check(self.learner_width >= 0, "learner_width", self.learner_width, "an integer >= 0")
        check(self.keep_alive_s >= 0, "keep_alive_s", self.keep_alive_s, "seconds >= 0")
        check(self.slice_s > 0, "slice_s", self.slice_s, "seconds > 0")
        check(self.place_timeout_s > 0, "place_timeout_s", self.place_timeout_s, "seconds > 0")
        check(
            self.learner_mmap_threshold >= 0,
            "learner_mmap_threshold",
            self.learner_mmap_threshold,
            "bytes >= 0 (0: glibc's default)",
        )
        self.fault_plan  # noqa: B018 -- a bad fault spec is refused here, naming its key

    @property
    def fault_plan(self) -> FaultPlan:
        """`faults` and `fault_schedule`, parsed (they stay plain mappings for config.yaml)."""
        return parse_faults(self.faults, self.fault_schedule)
