"""The Ray executor runs a step's plan on several functions without changing a single token.

One embedded Ray for the module; each scenario runs steps of the tiny preset on two decode
functions (placement slot 0 is colocated with the learner) and is compared with the others. Faults
strike step 3 of runs whose first two steps, undisturbed, other tests read: a run fewer (in the
run with a long tail, steps 1 and 2 slow a function down, which changes nothing trained).
"""

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from rlhfless.config import load_config
from rlhfless.data import PromptLoader, load_prompts
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.runtime import ray_executor
from rlhfless.runtime.executor import build_learner
from rlhfless.runtime.lifecycle import Functions
from rlhfless.runtime.machine import CPU_SLOT
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.pool import FunctionPool
from rlhfless.runtime.trainer import advantages, build_executor, tokenize_prompts, train

BASE = (
    "runtime.executor=ray",
    "data.batch_size=8",
    "generation.max_new_tokens=48",
    "scheduler.n_min=2",
    "runtime.slice_s=0.005",
)


pytestmark = pytest.mark.usefixtures("local_ray")  # tests/runtime/conftest.py


def run(
    *overrides: str,
    steps: int = 1,
    full: bool = True,
    cold_start_s: float = 0.0,
    prefill_scale: float = 1.0,
    setup=lambda executor: None,
    planned=lambda plan: None,
) -> list[dict]:
    """Steps of the tiny preset on the Ray executor, planned for a two-slot machine whose cold
    starts the planner takes to last `cold_start_s` (and its prefills `prefill_scale` times the
    roofline's); `setup` sees the executor before the first step, `planned` each plan."""
    cfg = load_config(preset="tiny", overrides=(*BASE, *overrides))
    tokenizer = load_tokenizer(cfg.model)
    loader = PromptLoader(load_prompts(cfg.data), cfg.data.batch_size, cfg.seed, cfg.data.shuffle)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    executor = build_executor(cfg, tokenizer, policy)
    predictor = LengthPredictor.from_config(cfg.scheduler)
    shape = ModelShape.from_hf_config(policy.config.to_dict())
    profile = roofline_profile(shape, CPU_SLOT, cold_start_s=cold_start_s)
    profile = dataclasses.replace(profile, prefill_ms=profile.prefill_ms * prefill_scale)
    planner = StepPlanner(
        cfg.scheduler,
        profile,
        ClusterSpec(nodes=1, gpus_per_node=2),
        cfg.algorithm.group_size,
        resident_units=1.0,
    )
    out = []
    try:
        record = {"weights": parameters_to_vector(policy.parameters()).detach().clone()}
        setup(executor)
        for step in range(1, steps + 1):
            before = record.get("weights")
            prompts = tokenize_prompts(next(loader), tokenizer, cfg.generation.max_prompt_tokens)
            plan = planner.plan(prompts, [None] * len(prompts), predictor, executor.warm_functions())
            planned(plan)
            samples, metrics = executor.generate(prompts, plan, step)
            record = {
                "plan": plan,
                "samples": samples,
                "metrics": metrics,
                "n_prompts": len(prompts),
                "before": before,
            }
            if full:
                record["ref"], record["prepare"] = executor.prepare(prompts, samples)
                record["advantages"] = advantages(cfg, samples)
                record["learning"] = executor.learn(samples, record["advantages"], record["ref"])
                record["weights"] = parameters_to_vector(executor.policy.parameters()).detach().clone()
                hellos = ray.get([rank.hello.remote() for rank in executor.learner.ranks])
                record["rank_pids"] = [hello.pid for hello in hellos]  # the phase's rank processes
                record["billing"], record["timeline"] = executor.finish_step(step)
            out.append(record)
    finally:
        executor.close()
    return out


def tokens(samples) -> list[tuple]:
    return [(s.uid, s.sample, tuple(s.response_ids)) for s in samples]


RLHFLESS = ("scheduler.policy=rlhfless", "scheduler.cut_and_migrate=false")
# Steps 1 and 2: one decode function slowed (the colocated one, then the remote one), so that the
# other's groups are prepared while it still decodes (overlap_preparation, on for rlhfless). The
# pause outlasts the other's decode with room to spare: at 2 s (margins of 1.8-2.4 s when timed
# alone), both once ended together in a full suite run and nothing was prepared early.
TAIL = (
    "[{kind: slow, step: 1, actor: colocated, after: 2, seconds: 5},"
    " {kind: slow, step: 2, actor: remote, after: 2, seconds: 5}]"
)
# Step 3: the remote decode function killed, the colocated one slowed, the prepare function killed.
KILLED_AND_SLOWED = (
    "[{kind: decode_exit, step: 3, actor: remote, after: 12},"
    " {kind: slow, step: 3, actor: colocated, after: 2, seconds: 0.2}, {kind: prepare_exit, step: 3}]"
)


@pytest.fixture(scope="module")
def rlhfless_run():
    """Three steps whose planner takes a cold start to cost more than idling to the next step;
    steps 1 and 2 with a long tail (`TAIL`)."""
    return run(*RLHFLESS, f"runtime.faults={TAIL}", steps=3, cold_start_s=100.0)


@pytest.fixture(scope="module")
def rlhfless(rlhfless_run):
    return rlhfless_run[:2]


@pytest.fixture(scope="module")
def free_cold_starts():
    """Three steps whose planner takes cold starts to be free, preparing after generation only;
    steps 1 and 2 undisturbed, step 3 under `KILLED_AND_SLOWED`."""
    return run(
        *RLHFLESS, "scheduler.overlap_preparation=false", f"runtime.faults={KILLED_AND_SLOWED}", steps=3
    )


# Step 3's held decode function (the one not on the learner's slot) dies, after 12 iterations of
# its own.
HELD_LOST = "[{kind: decode_exit, step: 3, actor: remote, after: 12}]"


@pytest.fixture(scope="module")
def verl_run():
    """Three steps learning on every slot verl holds (the tiny preset keeps to the learner's);
    steps 1 and 2 undisturbed, step 3 loses its held decode function."""
    return run(
        "scheduler.policy=verl",
        "runtime.learner_width=0",
        f"runtime.faults={HELD_LOST}",
        steps=3,
        setup=warmed_up,
    )


def warmed_up(executor) -> None:
    """`warm_up`, waited out: its functions have started before step 1 asks for them, and rank 0
    holds its optimizer states (`learner.prime`)."""
    executor.warm_up()
    ray.get([lease.hello for lease in executor.functions.pool.idle])
    assert ray.get(executor.learner.rank0.__ray_call__.remote(lambda r: len(r.learner.optimizer.state)))


@pytest.fixture(scope="module")
def verl(verl_run):
    """Its two undisturbed steps (a fault is armed for its step only)."""
    return verl_run[:2]


def test_plan_runs_on_several_decode_functions_and_yields_every_sample_in_canonical_order(rlhfless):
    first = rlhfless[0]
    decode = [f for f in first["timeline"]["functions"] if f["kind"] == "decode"]
    assert first["plan"].n_actors == 2 and len(decode) == 2
    assert sum(f["colocated_with"] == "learner" for f in decode) == 1
    samples = first["samples"]
    assert len(samples) == first["n_prompts"] * 4
    assert [s.key for s in samples] == sorted(s.key for s in samples)
    assert first["metrics"]["prefill/tokens_computed"] < first["metrics"]["prefill/tokens_naive"]
    # the learner computed the plan's prefix levels once, each function its prompts' own parts
    assert first["metrics"]["prefill/tokens_computed"] == first["plan"].prefill["tokens_computed"]
    assert first["plan"].prefix_tree and first["metrics"]["prefill/tree_ratio"] < 1.1


def test_billing_adds_up_and_the_learner_is_billed_the_whole_step(rlhfless, verl):
    for record in (*rlhfless, *verl):
        billing, functions = record["billing"], record["timeline"]["functions"]
        assert sum(f["cost"] for f in functions) == pytest.approx(billing["cost/step"], rel=1e-9)
        phases = billing["cost/generation"] + billing["cost/preparation"] + billing["cost/learning"]
        assert phases == pytest.approx(billing["cost/step"], rel=1e-9)
        learner = next(f for f in functions if f["kind"] == "learner")
        assert learner["started"] == 0 and learner["cost"] > 0
        assert all(f["released"] <= learner["released"] + 1e-6 for f in functions)
        assert all(f["cost"] == 0 for f in functions if f["colocated_with"])


def test_verl_holds_its_decode_functions_for_the_whole_step_rlhfless_releases_them(rlhfless, verl):
    def remote(record):
        return next(
            f for f in record["timeline"]["functions"] if f["kind"] == "decode" and not f["colocated_with"]
        )

    learner_end = lambda record: record["timeline"]["functions"][0]["released"]  # noqa: E731
    assert remote(verl[0])["released"] == pytest.approx(learner_end(verl[0]), abs=1e-3)
    assert remote(rlhfless[0])["released"] < learner_end(rlhfless[0])


def test_verl_learns_on_every_slot_it_holds_with_ranks_that_live_across_steps(verl):
    # Two slots: the learner's (rank 0, and the colocated decode function) and a held decode
    # function's, which a resident rank shares; started in step 1, the same process in step 2.
    first, second = verl
    assert [record["learning"]["learner/width"] for record in verl] == [2, 2]
    assert first["rank_pids"] == second["rank_pids"] and len(set(first["rank_pids"])) == 2
    for record in verl:
        functions = {f["name"]: f for f in record["timeline"]["functions"]}
        [held] = [f for f in functions.values() if f["kind"] == "decode" and not f["colocated_with"]]
        rank = functions["learner-1"]
        assert rank["colocated_with"] == held["name"] and rank["units"] == 0 and rank["cost"] == 0
        assert rank["node"] == held["node"]
        assert rank["cold"] == (record is first)
        learning = rank["busy"][0][0], rank["busy"][-1][1]  # its slot busy meanwhile (to the ms)
        assert any(a - 1e-3 <= learning[0] and learning[1] <= b + 1e-3 for a, b in held["busy"])


def test_verl_is_billed_its_held_slots_for_the_step_and_nothing_more(verl):
    # Learning on the held slot adds no bill: the learner's slot for the step, the held decode
    # function's from its lease to the step's end (warm in the pool before, billed as keep-alive:
    # from the step's start in step 2), and nothing else.
    for record in verl:
        billing, functions = record["billing"], record["timeline"]["functions"]
        learner = next(f for f in functions if f["name"] == "learner")
        [held] = [f for f in functions if f["kind"] == "decode" and not f["colocated_with"]]
        warm = sum(f["released"] - f["started"] for f in functions if f["kind"] == "keep-alive")
        step = learner["released"] - learner["started"]
        assert held["released"] == pytest.approx(step, abs=1e-3)
        billed = step + held["released"] - held["started"] + warm
        assert billing["time/billed"] + billing["time/keep_alive"] == pytest.approx(billed, abs=1e-2)
        assert [f["name"] for f in functions if f["cost"] > 0 and f["kind"] == "learner"] == ["learner"]
    second = verl[1]["timeline"]["functions"]
    [held] = [f for f in second if f["kind"] == "decode" and not f["colocated_with"]]
    [warm] = [f for f in second if f["kind"] == "keep-alive"]
    assert warm["started"] == 0 and warm["released"] == pytest.approx(held["started"], abs=1e-3)


def test_a_held_function_lost_under_verl_takes_its_resident_rank_with_it(verl_run):
    # Step 3's held decode function dies: its sequences finish elsewhere, its rank (living since
    # step 1) is stopped, and the step learns on what verl still holds (a replacement function
    # gets a new rank).
    assert [record["metrics"]["faults"] for record in verl_run] == [0, 0, 1]
    _, first, second = verl_run  # steps 2 and 3
    functions = {f["name"]: f for f in second["timeline"]["functions"]}
    [dead] = [f for f in functions.values() if any(e["kind"] == "fault" for e in f["events"])]
    assert dead["kind"] == "decode" and not dead["colocated_with"]
    assert first["rank_pids"][1] not in second["rank_pids"]
    held = [
        f
        for f in functions.values()
        if f["kind"] == "decode"
        and not f["colocated_with"]
        and not any(e["kind"] == "fault" for e in f["events"])
    ]
    assert second["learning"]["learner/width"] == 1 + len(held)
    for r in range(1, 1 + len(held)):
        rank = functions[f"learner-{r}"]
        assert rank["cold"] and rank["colocated_with"] in {f["name"] for f in held}


def test_a_function_kept_warm_is_reused_next_step_and_billed_while_idle(rlhfless):
    first, second = rlhfless
    assert all(a.keep_warm for a in first["plan"].actors)
    assert first["billing"]["actors/cold_starts"] >= 2
    assert second["billing"]["actors/cold_starts"] == 0
    [warm] = [f for f in first["timeline"]["functions"] if f["kind"] == "keep-alive"]
    idle = warm["released"] - warm["started"]
    assert idle > 0 and warm["cost"] == pytest.approx(1.95 / 3600 * warm["units"] * idle, rel=1e-4)
    assert first["billing"]["cost/keep_alive"] == pytest.approx(warm["cost"])


def test_a_function_whose_next_use_is_far_is_stopped_at_release_and_idles_unbilled(free_cold_starts):
    # A cold start the planner believes free is never worth an idle bill: stop at release.
    first, second, _ = free_cold_starts
    assert first["metrics"]["faults"] == second["metrics"]["faults"] == 0
    remote = [a for a in first["plan"].actors if a.gpu_ids[:1] != [0]]
    assert remote and not any(a.keep_warm for a in remote)
    assert first["billing"]["cost/keep_alive"] == 0
    assert second["billing"]["actors/cold_starts"] >= 1


def test_rlhfless_and_verl_first_step_rollouts_are_token_identical(rlhfless, verl):
    assert tokens(rlhfless[0]["samples"]) == tokens(verl[0]["samples"])  # verl's warmed up


def test_functions_warmed_up_before_the_first_step_start_no_cold_there(rlhfless, verl):
    # verl's run started its colocated decode and prepare functions (the latter runs the reference
    # model here) before step 1, by `warm_up`; rlhfless's, not warmed up, started both cold in
    # step 1. Neither is billed: both are on the learner's resources.
    def colocated(record) -> dict[str, tuple[bool, float]]:
        functions = record["timeline"]["functions"]
        return {
            f["kind"]: (f["cold"], f["cost"])
            for f in functions
            if f["colocated_with"] == "learner" and f["kind"] in ("decode", "reference")
        }

    assert colocated(verl[0]) == {"decode": (False, 0.0), "reference": (False, 0.0)}
    assert colocated(rlhfless[0]) == {"decode": (True, 0.0), "reference": (True, 0.0)}


def test_a_bfloat16_learner_leaves_the_rollouts_in_float32(rlhfless):
    """The decode functions load float32 weights (float32's bytes) and sample float32's tokens."""
    [bf16] = run(*RLHFLESS, "model.compute_dtype=bfloat16", full=False, cold_start_s=100.0)
    fp32 = rlhfless[0]
    assert bf16["plan"].n_actors == 2
    assert bf16["metrics"]["bytes/weight_sync"] == fp32["metrics"]["bytes/weight_sync"] > 0
    assert tokens(bf16["samples"]) == tokens(fp32["samples"])


def test_the_learning_phase_takes_the_width_the_steps_plan_chose():
    """Both slots are free once the two decode functions are released (the phase's own choice:
    two ranks); a plan that chose one rank under a budget gets one."""

    def one_rank(plan) -> None:
        assert plan.n_actors == 2 and plan.learner_width == 0  # no target: the phase's choice
        plan.learner_width = 1  # as a budget between the widths chooses

    [step] = run(*RLHFLESS, "runtime.learner_width=0", planned=one_rank)
    assert step["learning"]["learner/width"] == 1 and len(step["rank_pids"]) == 1


def test_an_actor_cut_at_tau_has_its_sequences_finished_elsewhere_with_the_same_tokens():
    # A longer cap lets most random-weight sequences reach EOS early, so actors cross tau at
    # different moments (with 48 tokens nearly all run to the cap and finish together).
    longer = ("generation.max_new_tokens=400", "scheduler.policy=rlhfless")
    # The paper's rule moves every straggler of a cut actor (the gain rule may keep them all).
    [cut] = run(*longer, "scheduler.tau=0.3", "scheduler.migration=paper", full=False)
    # Uncut: the same step on the learner's own engine, in this process (no functions to start).
    [whole] = run(*longer, "runtime.executor=inprocess", "scheduler.cut_and_migrate=false", full=False)
    assert cut["metrics"]["migrations"] > 0
    assert tokens(cut["samples"]) == tokens(whole["samples"])


def test_the_runtime_cuts_by_the_plans_time_table_moving_no_straggler_that_would_finish_later():
    """The planner's gain test, as the simulator runs it: re-prefilling a migrant (its KV left
    behind) would take longer than finishing where it is, so nothing moves."""
    longer = ("generation.max_new_tokens=400", "scheduler.policy=rlhfless", "scheduler.tau=0.3")
    [kept] = run(*longer, "runtime.migrate_kv=false", full=False, prefill_scale=1e6)
    assert kept["plan"].n_actors == 2
    assert kept["metrics"]["migrations"] == 0


def test_killed_and_slowed_functions_are_replaced_and_the_step_is_unchanged(rlhfless_run, free_cold_starts):
    # Step 3 of both runs: the same prompts and, after two identical learning steps, the same weights.
    faulty, undisturbed = free_cold_starts[2], rlhfless_run[2]
    metrics, functions = faulty["metrics"], faulty["timeline"]["functions"]
    assert metrics["faults"] == 1 and metrics["faults/rerun_sequences"] > 0
    assert metrics["faults/injected"] == 2  # the exit and the slow-down, each where it was aimed
    assert metrics["faults/resumed_tokens"] > 0  # resumed from the last report, not from scratch
    assert faulty["prepare"]["faults/prepare"] == faulty["prepare"]["faults/prepare_injected"] == 1
    events = {e["kind"] for f in functions for e in f["events"]}
    assert {"fault", "injected:decode_exit", "injected:slow"} <= events
    assert sum(e["kind"] == "fault" for f in functions if f["kind"] == "reference" for e in f["events"]) == 1
    assert tokens(faulty["samples"]) == tokens(undisturbed["samples"])
    assert [s.reward for s in faulty["samples"]] == [s.reward for s in undisturbed["samples"]]


def test_ppo_critic_runs_under_ray_as_a_colocated_function_billed_through_the_learner(tmp_path):
    cfg = load_config(
        preset="tiny",
        overrides=(
            "runtime.executor=ray",  # the tiny preset's one decode function: the critic is the point
            "algorithm.name=ppo",
            "trainer.steps=1",
            f"output_dir={tmp_path}",
            "trainer.progress=false",
            "trainer.tensorboard=false",
        ),
    )
    train(cfg)
    timeline = json.loads((tmp_path / "timeline" / "step_000001.json").read_text())
    critic = next(f for f in timeline["functions"] if f["kind"] == "critic")
    learner = next(f for f in timeline["functions"] if f["kind"] == "learner")
    assert critic["colocated_with"] == "learner" and critic["cost"] == 0
    assert learner["started"] <= critic["busy"][0][0] < critic["busy"][0][1] <= learner["released"]
    row = json.loads((tmp_path / "metrics.jsonl").read_text().split("\n")[0])
    assert row["cost/step"] == pytest.approx(sum(f["cost"] for f in timeline["functions"]), rel=1e-9)
    assert row["cost/learning"] > 0 and "loss/value" in row


def test_groups_prepared_in_the_tail_change_no_reward_log_prob_advantage_or_update(
    rlhfless_run, free_cold_starts
):
    # Steps 1 and 2: with a decode function slowed, the other's groups are scored and run through
    # the reference while it decodes (a decode function's slot, then the learner's prepare
    # function); without overlap, all after generation. Everything trained on is the same bits.
    overlapped = set()
    for on, off in zip(rlhfless_run[:2], free_cold_starts[:2], strict=True):
        assert tokens(on["samples"]) == tokens(off["samples"])
        assert [(s.reward, s.reward_components) for s in on["samples"]] == [
            (s.reward, s.reward_components) for s in off["samples"]
        ]
        assert all(torch.equal(a, b) for a, b in zip(on["advantages"], off["advantages"], strict=True))
        assert len(on["ref"]) == len(on["samples"])
        assert all(torch.equal(a, b) for a, b in zip(on["ref"], off["ref"], strict=True))
        assert torch.equal(on["weights"], off["weights"])

        functions = on["timeline"]["functions"]
        last_decode = max(f["busy"][-1][1] for f in functions if f["kind"] == "decode")
        calls = on["timeline"]["preparation"]["calls"]
        early = [c for c in calls if c["overlapped"]]
        assert early and min(c["start"] for c in early) < last_decode
        assert on["prepare"]["time/prep_overlapped"] > 0 and on["prepare"]["prep/overlapped_groups"] > 0
        assert sum(c["groups"] for c in calls) >= on["n_prompts"]  # every group prepared
        assert off["prepare"]["time/prep_overlapped"] == 0
        assert not any(c["overlapped"] for c in off["timeline"]["preparation"]["calls"])
        by_name = {f["name"]: f for f in functions}
        for c in early:  # a decode function's slot is billed while it prepares; the learner's is anyway
            f = by_name[c["function"]]
            assert f["kind"] == "reference" and (f["cost"] > 0) == (f["colocated_with"] is None)
            overlapped.add(f["colocated_with"] or "decode slot")
    assert overlapped == {"learner", "decode slot"}


def test_groups_learned_ahead_on_an_early_rank_make_the_update_the_learner_would(monkeypatch):
    """Sequences admitted in waves, the decode function (on the learner's slot) paused after the
    first: its groups are scored while it decodes, the first extra rank starts early on the free
    slot and learns them ahead, and the update's gradient and loss are the in-process learner's on
    the same samples. A measured phase is stood in for (its seconds a token, its rank start), and
    the planner's two timing rules say yes, so that the step's timing alone decides nothing."""
    monkeypatch.setattr(ray_executor, "start_ranks_ahead", lambda *args: True)
    monkeypatch.setattr(ray_executor, "learn_ahead_fits", lambda *args: True)

    def measured(executor) -> None:
        executor.learner.token_s, executor.learner.rank_starts = 1e-3, [1.0]

    overrides = (
        *RLHFLESS,
        "scheduler.n_min=1",
        "scheduler.learn_ahead=true",
        "algorithm.kl_coef=0",
        "generation.max_running=8",
        "runtime.learner_width=2",
        # A rank starts in the pause: ~8 s alone on a 2-core CPU, up to twice that beside the other
        # test worker (with a 6 s pause it once joined only after generation, learning none ahead).
        "runtime.faults=[{kind: slow, step: 1, actor: colocated, after: 60, seconds: 20}]",
    )
    (step,) = run(*overrides, setup=measured)
    cfg = load_config(preset="tiny", overrides=(*BASE, *overrides))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    vector_to_parameters(step["before"], policy.parameters())
    want = build_learner(cfg, policy, tokenizer.pad_token_id).learn(step["samples"], step["advantages"], None)

    got = step["learning"]
    assert got["learner/width"] == 2 and got["learn/ahead_groups"] >= 1 and got["time/learn_ahead"] > 0
    for key in ("loss/policy", "grad_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    rank = {f["name"]: f for f in step["timeline"]["functions"]}["learner-1"]
    generation_end = step["timeline"]["preparation"]["generation_end"]
    assert rank["requested"] < generation_end and rank["busy"][0][0] < rank["busy"][-1][0]


# A function started ahead of its first use: how long it has been starting, and its whole start
# once it is up, which the planner learns to price the run's first step with.
HOST = ("decode", True, "driver")


@ray.remote(num_cpus=0)
class Starting:
    """A function whose start takes `seconds` past its process's (created once `after` is ready)."""

    def __init__(self, seconds: float, after: object = None) -> None:
        self.seconds, self.created = seconds, time.time()

    def where(self) -> str:
        return "node"

    def hello(self) -> SimpleNamespace:
        time.sleep(self.seconds)
        return SimpleNamespace(ready=time.time(), created=self.created)


def test_a_prestarted_function_says_how_long_it_has_been_starting_and_then_its_whole_start(local_ray):
    pool = FunctionPool(lambda shape, after: Starting.remote(1.0), keep_alive_s=300.0)
    assert pool.starting_s(HOST, time.time()) == 0.0  # none: a whole start ahead
    begun = time.time()
    pool.prestart(HOST, begun)
    assert pool.starting_s(HOST, begun + 0.5) == pytest.approx(0.5)  # its start takes over 1 s
    ready = ray.get(pool.idle[0].hello).ready
    assert pool.starting_s(HOST, time.time()) is None  # started
    lease = pool.acquire(HOST, time.time())
    assert not lease.cold
    assert pool.prestart_s == {"decode": pytest.approx(ready - begun)} and ready - begun >= 1.0
    assert pool.starting_s(HOST, time.time()) is None  # in use
    pool.release(lease, time.time())
    pool.prestart_s.clear()
    assert pool.acquire(HOST, time.time()) is lease and pool.prestart_s == {}  # measured once
    pool.close()


def test_the_prepare_function_is_created_once_the_decode_function_that_step_1_waits_for_is_ready():
    """Both pre-started at once on two cores, the decode function took 6.8-7.7 s to start, alone
    4.4-4.8 s; step 1 waits for it first and needs the prepare function only when its generation
    ends. Ray holds the prepare function's creation until the decode function's start is ready."""
    cfg = load_config(preset="tiny", overrides=BASE)
    functions = Functions(cfg, load_tokenizer(cfg.model), False, False, "driver")
    functions.pool.create = lambda shape, after: Starting.remote(3.0, after)
    functions.prestart("decode")
    functions.prestart("prepare", after="decode")
    decode, prepare = (ray.get(lease.hello) for lease in functions.pool.idle)
    assert prepare.created >= decode.ready
    functions.close()
