"""On a real multi-node Ray cluster (several raylets on this machine, `ray.cluster_utils.Cluster`):
plans are made for the nodes Ray has, carried out on them, and survive a lost node.

One cluster for the module: a head of one CPU (the driver's node, which also has the learner's
slot) and a worker of one CPU; a node is added by one test and killed by a later one. Each test
drives steps of the tiny preset the way the trainer does, planning for `executor.cluster()`.
"""

import time

import psutil
import pytest
import ray
from cluster_support import shut_down
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rlhfless.config import load_config
from rlhfless.data import PromptLoader, load_prompts
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.runtime import decode_round
from rlhfless.runtime.machine import CPU_SLOT
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.trainer import advantages, build_executor, tokenize_prompts

BASE = (
    "runtime.executor=ray",
    "data.batch_size=8",
    "generation.max_new_tokens=48",
    "scheduler.n_min=8",  # as many functions as the cluster has slots
    "scheduler.cut_and_migrate=false",
    "runtime.slice_s=0.005",
    "runtime.learner_width=1",  # learning on the learner's slot: these tests are about generation
)
PLACE_TIMEOUT_S = 10
FAST_HEALTH_CHECK = {"health_check_period_ms": 200, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECK},
    )
    cluster.worker = cluster.add_node(num_cpus=1)  # the node the first test's plan uses beside the head
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    shut_down(cluster)


class Driver:
    """The trainer's step loop, cut down: plan for the cluster Ray reports, generate, learn."""

    def __init__(self, *overrides: str) -> None:
        self.cfg = load_config(preset="tiny", overrides=(*BASE, *overrides))
        self.tokenizer = load_tokenizer(self.cfg.model)
        cfg = self.cfg
        self.loader = PromptLoader(load_prompts(cfg.data), cfg.data.batch_size, cfg.seed, cfg.data.shuffle)
        policy = load_model(cfg.model, len(self.tokenizer), cfg.seed)
        self.executor = build_executor(cfg, self.tokenizer, policy)
        shape = ModelShape.from_hf_config(policy.config.to_dict())
        self.predictor = LengthPredictor.from_config(cfg.scheduler)
        self.planner = StepPlanner(
            cfg.scheduler,
            roofline_profile(shape, CPU_SLOT),
            self.executor.cluster(),
            cfg.algorithm.group_size,
            resident_units=1.0,
        )
        self.step = 0

    def run_step(self, full: bool = True) -> dict:
        self.step += 1
        ex, cfg = self.executor, self.cfg
        prompts = tokenize_prompts(next(self.loader), self.tokenizer, cfg.generation.max_prompt_tokens)
        spec = ex.cluster()
        plan = self.planner.plan(prompts, [None] * len(prompts), self.predictor, ex.warm_functions(), spec)
        samples, metrics = ex.generate(prompts, plan, self.step)
        ref, _ = ex.prepare(prompts, samples)
        ex.learn(samples, advantages(cfg, samples), ref)
        billing, timeline = ex.finish_step(self.step)
        return {"spec": spec, "plan": plan, "samples": samples, "metrics": metrics, "timeline": timeline}

    def close(self) -> None:
        self.executor.close()


def tokens(samples) -> list[tuple]:
    return [(s.uid, s.sample, tuple(s.response_ids)) for s in samples]


def decode_nodes(timeline: dict) -> list[str]:
    return sorted(f["node"] for f in timeline["functions"] if f["kind"] == "decode")


def lose_node(cluster: Cluster, node) -> None:
    """The machine goes down: its raylet killed, and with it the functions it started (which would
    otherwise serve a few more slices before they notice)."""
    [raylet] = node.all_processes["raylet"]  # the test cluster's own record of its processes
    workers = psutil.Process(raylet.process.pid).children(recursive=True)
    cluster.remove_node(node, allow_graceful=False)
    for p in workers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.fixture(scope="module")
def two_then_three(cluster):
    """Step 1 on the two nodes; a node is added; step 2."""
    driver = Driver()
    try:
        first = driver.run_step()
        added = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        second = driver.run_step()
    finally:
        driver.close()
    return first, second, added


def test_a_step_places_its_functions_on_the_nodes_its_plan_names(cluster, two_then_three):
    first, _, _ = two_then_three
    head, worker = cluster.head_node.node_id, cluster.worker.node_id
    assert first["spec"].node_gpus == (2, 1)  # the head's CPU and the learner's slot; the worker's
    assert first["plan"].n_actors == 3
    timeline = first["timeline"]
    assert decode_nodes(timeline) == sorted([head, head, worker])
    by_name = {f["name"]: f for f in timeline["functions"]}
    for a in first["plan"].actors:  # where each ran, as the function itself reported it
        assert by_name[f"decode-{a.actor}"]["node"] == [head, worker][a.node]
    assert [n["node"] for n in timeline["nodes"]] == [head, worker]
    worker_fn = next(f for f in timeline["functions"] if f["kind"] == "decode" and f["node"] == worker)
    [weights] = [
        t for t in timeline["transfers"] if t["kind"] == "weights" and t["target"] == worker_fn["name"]
    ]
    assert not weights["same_node"] and weights["bytes"] > 0 and weights["seconds"] > 0
    kv = [t for t in timeline["transfers"] if t["kind"] == "kv"]
    assert kv and all(t["same_node"] == (by_name[t["target"]]["node"] == head) for t in kv)
    assert first["metrics"]["cluster/nodes"] == 2


def test_a_node_added_between_steps_is_used_by_the_next_plan(two_then_three):
    _, second, added = two_then_three
    assert second["spec"].node_gpus == (2, 1, 1)
    assert second["plan"].n_actors == 4
    assert added.node_id in decode_nodes(second["timeline"])
    assert second["metrics"]["cluster/nodes"] == 3


def test_a_node_killed_mid_step_has_its_sequences_rerun_elsewhere_token_identical(
    cluster, two_then_three, monkeypatch
):
    first, _, added = two_then_three
    absorb = decode_round.DecodeRound._absorb
    killed = []

    def absorb_then_kill(self, run, report):  # at the first report from the added node: lose it
        absorb(self, run, report)
        if run.node == added.node_id and not killed:
            killed.append(time.time())
            lose_node(cluster, added)

    monkeypatch.setattr(decode_round.DecodeRound, "_absorb", absorb_then_kill)
    driver = Driver()
    try:
        lost = driver.run_step()
        monkeypatch.undo()
        assert killed and added.node_id not in alive_nodes()
        after = driver.run_step()
    finally:
        driver.close()
    assert lost["spec"].node_gpus == (2, 1, 1)  # planned before the loss: three nodes
    metrics, functions = lost["metrics"], lost["timeline"]["functions"]
    assert metrics["faults"] >= 1 and metrics["faults/rerun_sequences"] > 0
    assert any(e["kind"] == "fault" for f in functions if f["node"] == added.node_id for e in f["events"])
    assert tokens(lost["samples"]) == tokens(first["samples"])  # the undisturbed two-node step 1
    assert after["spec"].node_gpus == (2, 1)  # the next plan sees the smaller cluster
    assert added.node_id not in decode_nodes(after["timeline"])


@ray.remote(num_cpus=1)
class Squatter:
    """Another job's actor, taking a node's CPU after the plan was made for it."""

    def ready(self) -> bool:
        return True


def test_a_function_ray_cannot_place_in_time_is_replanned_not_waited_on(cluster, two_then_three):
    first, _, _ = two_then_three
    # The squatted function is stopped at this deadline, so the step lasts at least this long; a
    # function whose process starts later than it on a loaded machine counts as unplaced too (below).
    driver = Driver(f"runtime.place_timeout_s={PLACE_TIMEOUT_S}")
    worker = cluster.worker.node_id
    try:
        ex = driver.executor
        prompts = tokenize_prompts(next(driver.loader), driver.tokenizer, 10**6)
        plan = driver.planner.plan(prompts, [None] * len(prompts), driver.predictor, 0, ex.cluster())
        assert [a.node for a in plan.actors].count(1) == 1  # one function planned on the worker
        squatter = Squatter.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(worker, soft=False)
        ).remote()
        ray.get(squatter.ready.remote())
        samples, metrics = ex.generate(prompts, plan, 1)
        ray.kill(squatter)
        ref, _ = ex.prepare(prompts, samples)
        ex.learn(samples, advantages(driver.cfg, samples), ref)
        _, timeline = ex.finish_step(1)
    finally:
        driver.close()
    unplaced = [f for f in timeline["functions"] if any(e["kind"] == "unplaced" for e in f["events"])]
    # The worker's function; on a machine so loaded that a function's process starts later than the
    # deadline, that one counts as unplaced too (its sequences re-run elsewhere, tokens unchanged).
    assert worker in [f["node"] for f in unplaced] and metrics["faults/unplaced"] == len(unplaced)
    assert metrics["faults/rerun_sequences"] > 0
    # Stopped at its deadline, not waited on (the squatter holds the worker until the step is over).
    assert all(f["released"] - f["requested"] < 2 * PLACE_TIMEOUT_S for f in unplaced)
    assert tokens(samples) == tokens(first["samples"])
