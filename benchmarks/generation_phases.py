"""Where rlhfless's simulated generation spends its time above the floor, per scenario of a preset.

Runs rlhfless's steps through the simulator as `rlhfless simulate` does (`Simulator.run_step`: the
length pilot, the plans, the generation, unchanged) and prints, per step:
- the floor and the generation over it;
- when the decode actors start decoding (earliest and latest): each receives its prefix KV, then
  prefills its own prompts' part;
- when 50%, 90% and 99% of the step's sequences have finished;
- the tail, from the 99% mark to the last sequence's end, and at most how much of it moving
  stragglers to a faster actor shape could save (`tail_gain`). The simulator does not move them.

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

    generations: list[Generation]  # the last step's, set as its `execute` weighs the overlap

    def overlap(self, gens: list[Generation], *args) -> Overlap:
        self.generations = gens
        return super().overlap(gens, *args)


def tail_gain(gens: list[Generation], stage, mark: float) -> float:
    """At most how much of the tail after `mark` a faster actor shape could save: the sequence
    that ends last still has its remaining tokens at `mark` to decode, at best at the fastest
    shape's one-sequence step, resumed at no cost. A bound, optimistic on both counts."""
    k = int(np.argmax([g.finish.max() for g in gens]))
    gen = gens[k]
    last = int(np.argmax(gen.finish))
    run = next(r for r in gen.runs if last in r.sched.ids)
    here = int(np.flatnonzero(run.sched.ids == last)[0])
    # progress before this actor's last schedule, and on it by `mark` (none when it began later)
    done = gen.gen_before[last] + run.sched.generated_at(mark)[here]
    context = gen.prompt_len[last] + gen.true[last] / 2
    fastest = min(float(p.decode_step_seconds(1, context)) for p in stage.every_profile())
    return max(0.0, float(gen.finish[last]) - mark - (gen.true[last] - done) * fastest)


def phases(sim: Recording, step: int, prompts) -> dict[str, float | str]:
    """One step as `rlhfless simulate` runs it, and the phases read off its generation."""
    result = sim.run_step(step, prompts)
    gens = sim.generations
    finish = np.concatenate([g.finish for g in gens])
    decoding = [r.decoding for g in gens for r in g.runs]
    at = dict(zip(SHARES, np.quantile(finish, SHARES), strict=True))
    used = [r.gpus for g in gens for r in g.runs]
    return {
        "floor": result.floor_time,
        "generation": result.generation,
        "over": result.generation_over_floor,
        "decoding_first": min(decoding),
        "decoding_last": max(decoding),
        **{f"p{round(s * 100)}": float(v) for s, v in at.items()},
        "tail": float(finish.max()) - at[0.99],
        "tail_gain": tail_gain(gens, sim.stage, at[0.99]),
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
        f"{'decoding from':>13s} {'50%':>6s} {'90%':>6s} {'99%':>6s} {'tail':>5s} {'<= gain':>7s}"
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
                f"{r['over']:5.2f}x {r['decoding_first']:5.1f}-{r['decoding_last']:<7.1f} {r['p50']:6.1f} {r['p90']:6.1f} "
                f"{r['p99']:6.1f} {r['tail']:5.1f} {r['tail_gain']:7.1f}"
            )


if __name__ == "__main__":
    main()
