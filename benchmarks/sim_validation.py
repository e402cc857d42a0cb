"""Simulated: a held-out validation on the paper's cluster, on decode functions the planner sizes
(`validation.engine=functions`) against one engine (`learner`), with the runtime's planner code.

Workload: `--prompts` GSM8K-like prompts (the simulator's synthetic law; default 1,319, the size
of GSM8K's test set), one response each, lengths known to the planner (the oracle: after a run's
first validation the held-out set's own lengths predict the next one's, `validation_functions`).
Cluster: `paper-sim` (20 x 8 H100, Llama-2-70B at TP 8). The functions' side is planned as a
step's generation with nothing after it and run by the simulator's generation; the one engine's
side is one actor of the same size holding every prompt. Two bills: the simulator's (the
learner holds every GPU and hands them to decode functions, as verl's workers take them) and the
runtime's (the learner holds one actor's GPUs throughout, the decode function on them billed
through it, every other from its start to its release). Every figure is simulated.

    .venv/bin/python benchmarks/sim_validation.py [--prompts 1319] [--dataset gsm8k]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from rlhfless.planner import LengthPredictor
from rlhfless.planner.billing import Billing
from rlhfless.planner.pricing import charge
from rlhfless.sim.config import build
from rlhfless.sim.presets import preset
from rlhfless.sim.runner import make_stage, make_workload, scheduler_for
from rlhfless.sim.stage import Stage
from rlhfless.sim.step import Simulator, StepResult


def resident_bill(result: StepResult, stage: Stage) -> float:
    """The runtime's bill of a simulated generation: the learner's own actor's GPUs throughout,
    the decode functions not on them from their start to their release."""
    own = charge(stage.pricing, stage.profile.gpus, result.generation)
    return own + sum(
        charge(stage.pricing, a["gpus"], a["released"]) for a in result.actors if not a["colocated"]
    )


class Validating(Simulator):
    """The simulator's step with nothing after generation: a validation between steps."""

    def billing(self) -> Billing:
        return replace(super().billing(), after_per_token_s=0.0, after_billed_per_token_s=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1319)
    parser.add_argument("--dataset", default="gsm8k", choices=("gsm8k", "gpqa", "lcb"))
    args = parser.parse_args()
    _, tree = next(s for s in preset("paper-sim") if s[0].endswith(args.dataset))
    tree["workload"] |= {"prompts_per_step": args.prompts, "samples": 1}
    cfg = build(tree)
    stage, prompts = make_stage(cfg), make_workload(cfg).step(0)
    sides = {
        "functions (planned N)": scheduler_for(cfg, {"predictor": "oracle"}),
        "one engine": scheduler_for(cfg, {"predictor": "oracle", "policy": "verl", "n_max": 1}),
    }
    print(
        f"simulated: {args.prompts} {args.dataset}-like prompts x 1 response, {cfg.cluster.nodes} x "
        f"{cfg.cluster.gpus_per_node} {cfg.cluster.gpu}, {cfg.model.name} at TP {cfg.model.tp}"
    )
    print(f"{'side':24s} {'actors':>6s} {'seconds':>9s} {'USD (sim)':>10s} {'USD (runtime)':>14s}")
    results = {}
    for name, config in sides.items():
        sim = Validating(stage, config, LengthPredictor.from_config(config))
        result = sim.execute(0, prompts, sim.plan(prompts))
        results[name] = (result, resident_bill(result, stage))
        print(
            f"{name:24s} {result.n_actors:6d} {result.generation:9.1f} {result.cost_generation:10.2f} "
            f"{results[name][1]:14.2f}"
        )
    (functions, f_bill), (one, o_bill) = results.values()
    print(
        f"functions / one engine (simulated): time {functions.generation / one.generation:.3f}, cost "
        f"{functions.cost_generation / one.cost_generation:.3f} (simulator's bill), {f_bill / o_bill:.3f} "
        "(runtime's)"
    )


if __name__ == "__main__":
    main()
