"""The run memory: what earlier runs of a model learned on this machine (`machine.memory_path`),
which starts a new run's time model, and what each step of a run leaves the next.

Its seconds carry the machine's speed when they were learned, read by the speed probe as the
run started (`machine.Speed`), and a run reading them scales them to its own probe's speed. A
probe can read the machine wrong: one beside two CPU-bound processes read it 1.62x slow, and the
next quiet run, reading the seconds so labelled, forecast itself 38% short
(`benchmarks/bench_noisy_probe.py`). The runs' decode scales show it: each is the ratio of a
run's decode steps to the table at the speed its probe read, steady from run to run where the
probes read right (1.12-1.25 in session 58's quiet runs), and it is the wrongly probed run's
scale alone that moves (0.50-0.77). So the memory keeps the last `RUNS` runs' scales, and labels
a run's seconds with the speed its decode steps showed: its probe's, times its scale over the
median of the scales, which is the scale it keeps. It also keeps how far the runs' first steps
ran over their scale (first touches), so that a run's first step says its scale before its second
(`first_scale`), whatever its probe read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlhfless.files import write_atomic

RUNS = 5  # runs' decode scales kept: a median of five outvotes two wrongly probed runs


@dataclass
class RunMemory:
    """One memory file, and the decode scales of the runs that wrote it."""

    path: Path
    scales: list[float] = field(default_factory=list)  # earlier runs' decode scales, newest last
    # earlier runs' first-step decode ratio over their scale (first touches: 0.98-1.17 here)
    first_excess: list[float] = field(default_factory=list)

    def read(self) -> dict:
        """The state the last run left (empty where none, or damaged: it only costs what it would
        have taught); the earlier runs' scales are kept here."""
        try:
            state = json.loads(self.path.read_text())
            scales = state.pop("scales", None)
            if scales is None:  # kept before the scales were: its decode scale is its last run's
                last = state.get("calibration", {}).get("decode_scale")
                scales = [last] if last else []
            self.scales = [float(s) for s in scales][-RUNS:]
            self.first_excess = [float(x) for x in state.pop("first_excess", [])][-RUNS:]
        except (ValueError, OSError, TypeError, AttributeError):
            return {}
        state.pop("margins", None)  # the forecast's margins are a run's own
        return state

    def first_scale(self, ratio: float) -> float | None:
        """A run's decode scale as its first step's decode `ratio` says it (None: no earlier run
        measured how far a first step runs over): the speed probe's reading cancels out of it."""
        return ratio / float(np.median(self.first_excess)) if self.first_excess else None

    def write(self, state: dict, scale: float | None, first_excess: float | None = None) -> None:
        """`state` (its `calibration` and `probe_ms`) for the next run, with this run's decode
        `scale` and `first_excess` (None: not learned yet) among the earlier runs'; its seconds
        labelled with the speed the run's decode steps showed, its decode scale the runs' median."""
        scales = [*self.scales, scale][-RUNS:] if scale else self.scales
        excess = [*self.first_excess, first_excess][-RUNS:] if first_excess else self.first_excess
        probe = state.get("probe_ms")
        if scale and probe:
            usual = float(np.median(scales))
            state = {
                **state,
                "calibration": {**state["calibration"], "decode_scale": usual},
                "probe_ms": [ms * scale / usual for ms in probe],
            }
        write_atomic(self.path, json.dumps({**state, "scales": scales, "first_excess": excess}))
