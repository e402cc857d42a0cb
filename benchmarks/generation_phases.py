"""Where rlhfless's simulated generation spends its time above the floor, per scenario of a preset.

Runs rlhfless's steps through the simulator as `rlhfless simulate` does (`Simulator.run_step`: the
length pilot, the plans, the generation, unchanged) and prints, per step:
- the floor (latency and throughput bounds) and the generation over it;
- when the decode actors start decoding: each prefills its own prompts first (`t0`, earliest and
  latest), after the prefill actor's shared levels;
- when 50%, 90%, 99% and all of the step's sequences have finished;
- the tail bound: the seconds after 99% finished, and at most how many of them a faster actor shape
  could save if every sequence of that tail ran from then on at its one-sequence step (no resume
  cost; the shapes' one-sequence steps at the step's mean context). Moving stragglers across actor
  sizes, which the simulator does not do, can gain no more than this.

    .venv/bin/python benchmarks/generation_phases.py [--preset paper-sim] [--steps 3] [key=value ...]

All figures are simulated.
"""

from __future__ import annotations

import argparse

import numpy as np

from rlhfless.planner.predictor import LengthPredictor
from rlhfless.sim.config import build, set_dotted
from rlhfless.sim.generation import Generation
from rlhfless.sim.overlap import Overlap
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import VARIANTS, make_stage, make_workload, scheduler_for
from rlhfless.sim.step import Simulator

SHARES = (0.5, 0.9, 0.99)


class Recording(Simulator):
    """The simulator, keeping each step's generation (the parts `Simulator.execute` ran)."""

    generations: list[Generation] = []

    def overlap(self, gens: list[Generation], *args) -> Overlap:
        self.generations = gens
        return super().overlap(gens, *args)


def phases(sim: Recording, step: int, prompts) -> dict[str, float]:
    """One step as `rlhfless simulate` runs it, and the phases read off its generation."""
    result = sim.run_step(step, prompts)
    gens = sim.generations
    finish = np.concatenate([g.finish for g in gens])
    t0 = [r.decoding for g in gens for r in g.runs]
    at = dict(zip(SHARES, np.quantile(finish, SHARES), strict=True))
    end = float(finish.max())
    context = float(np.mean(np.concatenate([g.prompt_len + g.true / 2 for g in gens])))
    one = {p.gpus: float(p.decode_step_seconds(1, context)) for p in sim.stage.every_profile()}
    used = [r.gpus for g in gens for r in g.runs]
    slowest, fastest = max(one[k] for k in used), min(one.values())
    tail = end - at[0.99]
    return {
        "floor": result.floor_time,
        "generation": result.generation,
        "over": result.generation_over_floor,
        "t0_first": min(t0, default=0.0),
        "t0_last": max(t0, default=0.0),
        **{f"p{round(s * 100)}": float(v) for s, v in at.items()},
        "tail": tail,
        "tail_gain": tail * (1.0 - fastest / slowest),
        "shapes": ",".join(f"{k}x{used.count(k)}" for k in sorted(set(used))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper-sim")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="section.key=value, applied to every scenario")
    args = parser.parse_args()
    print(
        f"{'scenario (simulated)':26s} {'step':>4s} {'actors':>10s} {'floor':>6s} {'gen s':>6s} {'/floor':>6s} "
        f"{'t0 first-last':>13s} {'50%':>6s} {'90%':>6s} {'99%':>6s} {'tail':>5s} {'<= gain':>7s}"
    )
    for name, tree in preset(args.preset):
        for item in args.overrides:
            set_dotted(tree, item)
        cfg = build(tree)
        stage, workload = make_stage(cfg), make_workload(cfg)
        config = scheduler_for(cfg, VARIANTS["rlhfless"])
        sim = Recording(stage, config, LengthPredictor.from_config(config))
        for step in range(args.steps):
            r = phases(sim, step, workload.step(step))
            print(
                f"{name[-24:]:26s} {step:4d} {r['shapes']:>10s} {r['floor']:6.1f} {r['generation']:6.1f} "
                f"{r['over']:5.2f}x {r['t0_first']:5.1f}-{r['t0_last']:<7.1f} {r['p50']:6.1f} {r['p90']:6.1f} "
                f"{r['p99']:6.1f} {r['tail']:5.1f} {r['tail_gain']:7.1f}"
            )


if __name__ == "__main__":
    main()
