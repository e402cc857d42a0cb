"""Synthetic workloads carry the statistics the planner's predictor relies on."""

import json

import numpy as np
import pytest

from rlhfless.planner.pilot import JUDGED
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.planner.pricing import charge
from rlhfless.planner.profile import Profile
from rlhfless.sim.config import build
from rlhfless.sim.runner import make_stage, make_workload, scheduler_for
from rlhfless.sim.step import Simulator, pilot_seconds
from rlhfless.sim.workload import SyntheticWorkload, TraceWorkload, expected_lengths


def one_node(
    dataset: str, prompts: int, max_response: int, gpus: int = 4, model: str = "qwen2.5-3b", tp: int = 1
):
    """A simulated node of H100s and a GRPO workload of 4 samples a prompt."""
    return build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": gpus, "gpu": "h100"},
            "model": {"name": model, "tp": tp},
            "workload": {
                "dataset": dataset,
                "prompts_per_step": prompts,
                "samples": 4,
                "max_response": max_response,
            },
        }
    )


def changes_between_epochs(workload, step_a, step_b):
    a, b = workload.step(step_a), workload.step(step_b)
    first = dict(zip(a.uids, a.lengths[:, 0], strict=True))
    return np.array([abs(first[u] - n) for u, n in zip(b.uids, b.lengths[:, 0], strict=True)])


def test_gsm8k_lengths_are_as_stable_across_epochs_as_the_paper_measured():
    workload = SyntheticWorkload("gsm8k", 2000, 1, 2048, dataset_size=2000)
    change = changes_between_epochs(workload, 3, 4)  # every step is one epoch here
    assert 0.62 <= np.mean(change <= 50) <= 0.78  # paper: about 70%
    assert 0.85 <= np.mean(change <= 100) <= 0.95  # paper: about 90%


def test_lengths_are_long_tailed_capped_and_drift_upwards():
    workload = SyntheticWorkload("lcb", 1000, 4, 2048, dataset_size=1000)
    early, late = workload.step(0).lengths, workload.step(99).lengths
    assert early.max() == 2048 and early.min() >= 1
    assert np.mean(early) > np.median(early)  # long tail
    assert np.mean(late) > 1.1 * np.mean(early)


def test_samples_of_one_prompt_are_correlated():
    lengths = SyntheticWorkload("gsm8k", 1000, 2, 2048).step(0).lengths.astype(float)
    assert np.corrcoef(np.log(lengths[:, 0]), np.log(lengths[:, 1]))[0, 1] > 0.5


def test_every_prompt_appears_once_per_epoch_and_shares_the_system_prompt():
    workload = SyntheticWorkload("gpqa", 100, 2, 2048, dataset_size=400)
    seen = [u for step in range(4) for u in workload.step(step).uids]
    assert sorted(seen) == sorted(workload.uids)
    tokens = workload.step(0).prompt_tokens
    assert all(np.array_equal(t[:16], tokens[0][:16]) for t in tokens)


def test_trace_replays_recorded_lengths_per_step(tmp_path):
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    rows = [
        {"uid": "a", "sample": 0, "prompt": "q one", "response_tokens": 12},
        {"uid": "a", "sample": 1, "prompt": "q one", "response_tokens": 30},
        {"uid": "b", "sample": 0, "prompt": "q two", "response_tokens": 7},
        {"uid": "b", "sample": 1, "prompt": "q two", "response_tokens": 9},
    ]
    (rollouts / "step_000001.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    trace = TraceWorkload(tmp_path)
    step = trace.step(5)  # cycles over the one recorded step
    assert step.uids == ["a", "b"] and step.lengths.tolist() == [[12, 30], [7, 9]]
    assert step.prompt_tokens[0][0] == step.prompt_tokens[1][0]  # the shared word "q"
    # A trace's cap is unknown: its first step still runs the length pilot, and prices it.
    cfg = build({"model": {"name": "qwen2.5-3b", "tp": 1}, "workload": {"trace": str(tmp_path)}})
    sim = Simulator(make_stage(cfg), scheduler_for(cfg, {"length_pilot": 1}), LengthPredictor())
    assert sim.run_step(0, trace.step(0)).pilot_seconds > 0


def test_trace_uses_recorded_prompt_ids_and_survives_unicode_line_separators(tmp_path):
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    rows = [
        {
            "uid": "a",
            "sample": 0,
            "prompt": "x",
            "prompt_ids": [5, 6, 7],
            "response": "one\u2028two",
            "response_tokens": 4,
        },
        {
            "uid": "b",
            "sample": 0,
            "prompt": "y",
            "prompt_ids": [5, 8],
            "response": "ok",
            "response_tokens": 2,
        },
    ]
    (rollouts / "step_000001.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    )
    step = TraceWorkload(tmp_path).step(0)
    assert [t.tolist() for t in step.prompt_tokens] == [[5, 6, 7], [5, 8]]
    assert step.lengths.tolist() == [[4], [2]]


def test_expected_lengths_are_the_mean_of_many_draws_of_the_same_distribution():
    rng = np.random.default_rng(0)
    centre = np.log([50.0, 300.0, 1800.0])
    draws = np.clip(np.exp(centre[:, None, None] + 0.3 * rng.normal(size=(3, 40000, 4))), 1, 2048)
    got = expected_lengths(centre, 0.3, 4, 2048)
    np.testing.assert_allclose(got[:, 0], draws.max(axis=2).mean(axis=1), rtol=0.01)
    np.testing.assert_allclose(got[:, 1], draws.mean(axis=(1, 2)), rtol=0.01)
    assert got[2, 0] < 2048  # the cap clips draws, not the expectation's centre
    np.testing.assert_allclose(expected_lengths(centre, 0.0, 4, 2048), np.exp(centre)[:, None].repeat(2, 1))
    np.testing.assert_allclose(*expected_lengths(centre, 0.3, 1, 2048).T)  # one sample: max is mean


def test_the_expected_predictor_plans_each_prompt_at_its_expected_group_max():
    cfg = one_node("gsm8k", 32, 1024)
    stage, workload = make_stage(cfg), make_workload(cfg)
    sim = Simulator(stage, scheduler_for(cfg, {"predictor": "expected"}), LengthPredictor(mode="expected"))
    prompts = workload.step(0)
    plan = sim.plan(prompts)
    got = [plan.predicted_length[u] for u in prompts.uids]
    np.testing.assert_allclose(got, prompts.law.expected(4)[:, 0])
    np.testing.assert_allclose(
        prompts.subset(prompts.uids[3:5]).law.expected(4), prompts.law.expected(4)[3:5]
    )
    assert not np.allclose(got, prompts.lengths.max(axis=1))  # not the samples themselves
    with pytest.raises(ValueError, match="scheduler.predictor"):
        build({"workload": {"trace": "runs/x"}, "scheduler": {"predictor": "expected"}})


def test_the_simulators_plans_predict_no_response_past_the_workloads_cap():
    # LiveCodeBench's answers stand in for lengths once they fit: half a response each, so a long
    # prompt's answer times its ratio runs past a 2k cap. The runtime caps predictions at
    # max_new_tokens; the simulator plans as it does.
    cfg = one_node("lcb", 64, 2048)
    stage, workload = make_stage(cfg), make_workload(cfg)
    sim = Simulator(stage, scheduler_for(cfg, {}), LengthPredictor())
    for step in range(2):
        sim.run_step(step, workload.step(step))
    prompts = workload.step(2)
    assert (prompts.answer_tokens * 2 > 2048).any()  # answers that would predict past the cap
    plan = sim.plan(prompts)
    assert max(plan.predicted_length.values()) == 2048


def test_the_simulators_first_plan_starts_from_the_length_pilot_as_the_runtimes_does():
    cfg = one_node("gpqa", 16, 4096)
    prompts = make_workload(cfg).step(0)
    sim = Simulator(make_stage(cfg), scheduler_for(cfg, {"length_pilot": 1}), LengthPredictor())
    sim.pilot(prompts, 1)
    plan = sim.plan(prompts)
    # every prompt, the piloted one too (its uid stays unseen), takes the pilot group's max
    assert set(plan.predicted_length.values()) == {float(prompts.lengths[0].max())}
    unpiloted = Simulator(make_stage(cfg), scheduler_for(cfg, {"length_pilot": 0}), LengthPredictor())
    assert set(unpiloted.plan(prompts).predicted_length.values()) == {256.0}  # default_length


def test_a_pilot_of_several_answered_prompts_lets_the_first_plan_rank_its_prompts_by_their_answers():
    cfg = one_node("gsm8k", 64, 2048, gpus=8, model="llama-2-70b", tp=8)
    prompts = make_workload(cfg).step(0)
    sim = Simulator(make_stage(cfg), scheduler_for(cfg, {"length_pilot": 1}), LengthPredictor())
    asked: list[int] = []
    sim.pilot = lambda prompts, count: asked.append(count)
    sim.run_step(0, prompts)
    assert asked[0] >= 2  # one prompt asked for; the GPU's step is bound by its weights: more
    for count, ranked in ((1, False), (asked[0], True)):
        piloted = Simulator(make_stage(cfg), scheduler_for(cfg, {}), LengthPredictor())
        Simulator.pilot(piloted, prompts, count)
        plan = piloted.plan(prompts)
        predicted = np.array([plan.predicted_length[u] for u in prompts.uids])
        by_answer = predicted[np.argsort(prompts.answer_tokens, kind="stable")]
        # The simulated answers are a fixed share of each prompt's length: once two groups or more
        # judge them they fit, and the first plan follows them; one group judges nothing.
        assert (len(set(predicted)) > 1 and bool(np.all(np.diff(by_answer) >= 0))) == ranked


def test_on_a_cluster_whose_actors_hold_one_prompt_the_pilot_still_samples_enough_to_judge_answers():
    cfg = build(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "a100"},
            "model": {"name": "llama-2-7b", "tp": 1},
            "workload": {"dataset": "lcb", "prompts_per_step": 64, "samples": 16, "max_response": 8192},
        }
    )
    prompts = make_workload(cfg).step(0)
    sim = Simulator(make_stage(cfg), scheduler_for(cfg, {"length_pilot": 1}), LengthPredictor())
    asked: list[int] = []
    sim.pilot = lambda prompts, count: asked.append(count)
    sim.run_step(0, prompts)
    # KV memory for one prompt's 16 samples at a time; eight actors: the pilot takes JUDGED, in waves
    assert asked == [JUDGED]
    for count, ranked in ((1, False), (JUDGED, True)):  # the answers rank the first plan's prompts
        piloted = Simulator(make_stage(cfg), scheduler_for(cfg, {}), LengthPredictor())
        Simulator.pilot(piloted, prompts, count)
        assert (len(set(piloted.plan(prompts).predicted_length.values())) > 1) == ranked


def test_the_length_pilot_is_priced_as_one_actor_decoding_its_samples_together_outside_the_steps():
    # decode step = 10 ms + 1 ms a running sequence; prefill free
    profile = Profile(
        prefill_tokens=np.array([1.0, 1000.0]),
        prefill_ms=np.zeros(2),
        decode_batch=np.array([1.0, 1000.0]),
        decode_context=np.array([0.0, 1e4]),
        decode_ms=np.array([[11.0, 11.0], [1010.0, 1010.0]]),
    )
    # two samples of 1 and 3 tokens: 1 step at batch 2, then 2 at batch 1
    assert pilot_seconds(profile, np.array([5]), np.array([[1, 3]])) == pytest.approx(0.012 + 2 * 0.011)
    cfg = one_node("gsm8k", 64, 2048, gpus=8, model="llama-2-70b", tp=8)
    workload, stage = make_workload(cfg), make_stage(cfg)
    sim = Simulator(stage, scheduler_for(cfg, {"length_pilot": 1}), LengthPredictor())
    first, second = sim.run_step(0, workload.step(0)), sim.run_step(1, workload.step(1))
    assert first.pilot_prompts >= 2 and first.pilot_seconds > 0 and second.pilot_seconds == 0
    assert first.pilot_cost == pytest.approx(charge(stage.pricing, stage.profile.gpus, first.pilot_seconds))
