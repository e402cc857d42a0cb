"""A learning phase's join with and without the step's published weights taken ahead, alternated.

Drives the data-parallel learner alone (`ElasticLearner`, the default preset's model) on the
embedded Ray: each round prestarts rank 1 without, then with, the published weights (as a step
does during generation), waits until it is ready, opens the phase and closes it. Prints each
phase's `time/learner_start` (the phase's wait for rank 1: with the rank ready, its join) and
whether joining sent rank 0's weights, then the medians and their ratio. Alternating keeps the
machine's drift out of the ratio.

    .venv/bin/python benchmarks/bench_join.py [--rounds 4] [--preset default]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.billing import Meter
from rlhfless.runtime.dp_learner import ElasticLearner
from rlhfless.runtime.lifecycle import Functions
from rlhfless.runtime.ray_cluster import start_ray
from rlhfless.runtime.transfer import flat_weights

GROUPS = 8  # prompt groups the phase is sized for (the default preset's prompts a step)
SETTLE_S = 2.0  # after rank 1 is ready: its take of the weights done, as in generation's tail


def phase(elastic: ElasticLearner, cfg, weights: ray.ObjectRef | None) -> dict[str, float]:
    """One learning phase on a prestarted rank 1: its `time/learner_start` and weights sent."""
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    elastic.prestart(meter, 0, GROUPS, time.time(), weights)
    ray.get(elastic.ranks[1].hello.remote())
    time.sleep(SETTLE_S)
    elastic.widen(meter, GROUPS, [], time.time())
    got = dict(elastic.phase)
    elastic.narrow(time.time())
    meter.close_step(time.time())
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--preset", default="default")
    args = parser.parse_args()
    cfg = load_config(preset=args.preset, overrides=("runtime.executor=ray", "runtime.learner_width=0"))
    start_ray(cfg.runtime)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    functions = Functions(cfg, tokenizer, False, False, ray.get_runtime_context().get_node_id())
    elastic = ElasticLearner(cfg, policy, tokenizer, functions)
    published = ray.put(flat_weights(policy))
    waits: dict[bool, list[float]] = {False: [], True: []}
    try:
        ray.get(elastic.rank0.hello.remote())
        for k in range(args.rounds):
            for taken in (False, True):
                got = phase(elastic, cfg, published if taken else None)
                if got["learner/width"] != 2:
                    raise SystemExit(f"round {k}: the phase got width {got['learner/width']:.0f}, not 2")
                waits[taken].append(got["time/learner_start"])
                print(
                    f"round {k} weights taken ahead: {str(taken):5s} wait {got['time/learner_start']:.3f} s,"
                    f" weights sent at join: {got['learner/weights_sent']:.0f}",
                    flush=True,
                )
    finally:
        elastic.close()
        functions.close()
        ray.shutdown()
    before, after = statistics.median(waits[False]), statistics.median(waits[True])
    print(f"median wait: sent at join {before:.3f} s, taken ahead {after:.3f} s ({after / before:.3f}x)")


if __name__ == "__main__":
    main()
