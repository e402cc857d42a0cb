"""A learning phase's join with and without the step's published weights taken ahead, alternated.

Drives the data-parallel learner alone (`ElasticLearner`, the default preset's model) on the
embedded Ray: each round prestarts rank 1 three ways, as a step does during generation: without
the published weights; with them, the phase opening once its take is done (`SETTLE_S` after the
rank is ready); and with them, the phase opening as soon as the rank is ready, its take still
running (the join stops it, and rank 0 sends what it had not taken). Prints each phase's
`time/learner_start` (the phase's wait for rank 1: with the rank ready, its join), the share of
the weights joining sent, and the rank's take (seconds, share), then the medians. Alternating
keeps the machine's drift out of the comparison.

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


ARMS = (  # name, published weights given ahead, seconds the phase opens after the rank is ready
    ("sent at join", False, SETTLE_S),
    ("taken ahead", True, SETTLE_S),
    ("joined mid-take", True, 0.0),
)


def phase(elastic: ElasticLearner, cfg, weights: ray.ObjectRef | None, settle: float) -> dict[str, float]:
    """One learning phase on a prestarted rank 1: its `time/learner_start`, weights sent, and its
    take of the published weights (seconds, bytes)."""
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    elastic.prestart(meter, 0, GROUPS, time.time(), weights)
    ray.get(elastic.ranks[1].hello.remote())
    time.sleep(settle)
    elastic.widen(meter, GROUPS, [], time.time())
    got = dict(elastic.phase)
    takes = [t for t in meter.transfers if t.source == "learner"]
    got["take_s"] = sum(t.seconds for t in takes)
    got["take_bytes"] = sum(t.bytes for t in takes)
    got["send_s"] = sum(t.seconds for t in meter.transfers if t.source == "learner-0")
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
    flat = flat_weights(policy)
    published = ray.put(flat)
    waits: dict[str, list[float]] = {name: [] for name, _, _ in ARMS}
    try:
        ray.get(elastic.rank0.hello.remote())
        for k in range(args.rounds):
            for name, ahead, settle in ARMS:
                got = phase(elastic, cfg, published if ahead else None, settle)
                if got["learner/width"] != 2:
                    raise SystemExit(f"round {k}: the phase got width {got['learner/width']:.0f}, not 2")
                waits[name].append(got["time/learner_start"])
                print(
                    f"round {k} {name:15s} wait {got['time/learner_start']:.3f} s,"
                    f" weights sent at join {got['learner/weights_sent']:.2f},"
                    f" in {got['send_s']:.3f} s; take {got['take_s']:.3f} s of"
                    f" {got['take_bytes'] / flat.nbytes:.2f} of them",
                    flush=True,
                )
    finally:
        elastic.close()
        functions.close()
        ray.shutdown()
    medians = {name: statistics.median(w) for name, w in waits.items()}
    print("median wait: " + ", ".join(f"{name} {m:.3f} s" for name, m in medians.items()))


if __name__ == "__main__":
    main()
