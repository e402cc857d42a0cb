"""The data-parallel learner: two ranks on CPU make the single-process step, and a run saved at two
ranks resumes at one.

One embedded Ray with one CPU for the module: with the driver's slot, two learner slots.
"""

import copy
import json
import shutil
import time

import numpy as np
import psutil
import pytest
import ray
import torch
from safetensors.torch import load_file

from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner.pricing import charge
from rlhfless.runtime.billing import Meter
from rlhfless.runtime.checkpoint import load_learner_state
from rlhfless.runtime.data_parallel import split_rows
from rlhfless.runtime.dp_learner import ElasticLearner, Host
from rlhfless.runtime.executor import build_critic, build_learner
from rlhfless.runtime.learner_rank import rank_env
from rlhfless.runtime.lifecycle import Functions
from rlhfless.runtime.samples import Sample
from rlhfless.runtime.trainer import token_rewards, train, whiten_tokens
from rlhfless.runtime.transfer import flat_weights

pytestmark = pytest.mark.usefixtures("local_ray")  # tests/runtime/conftest.py


def make_samples(vocab: int, n_prompts: int = 5, group: int = 3) -> list[Sample]:
    """Groups of `group` samples sharing a prompt, lengths varied, rewards in [0, 1]."""
    g = torch.Generator().manual_seed(1)
    out = []
    for u in range(n_prompts):
        prompt = torch.randint(
            0, vocab, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g
        ).tolist()
        for k in range(group):
            r = int(torch.randint(1, 14, (1,), generator=g))
            response = torch.randint(0, vocab, (r,), generator=g).tolist()
            s = Sample(f"u{u}", k, prompt, response, "stop")
            s.reward = float(torch.rand((), generator=g))
            out.append(s)
    return out


def test_split_keeps_prompt_groups_whole_and_covers_every_row():
    samples = make_samples(50, n_prompts=7)
    rows = list(range(0, len(samples), 2)) + list(range(1, len(samples), 2))
    parts = split_rows(samples, rows, 3)
    assert sorted(i for part in parts for i in part) == sorted(rows)
    owner = {samples[i].uid: k for k, part in enumerate(parts) for i in part}
    assert all(owner[samples[i].uid] == k for k, part in enumerate(parts) for i in part)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def weights_close(a: torch.Tensor, b: torch.Tensor, lr: float) -> None:
    """Weights after Adam's steps: all but one element in a thousand (at least one) to 1% of a
    step, and every element to within two steps. Adam divides a gradient by its root mean square,
    so where a gradient nearly cancels, its float noise (a sum in another order) moves the step by
    much more than the noise: on an AVX2 CPU one element of 4096 came out 1.6% of a step apart
    (AVX-512 CPUs stayed within 1%). A learner that lost or mixed up a step moves most elements by
    about a step."""
    diff = (a - b).detach().abs()
    off = int((diff > 0.01 * lr + 1e-4 * b.abs()).sum())
    assert off <= max(1, a.numel() // 1000), f"{off} of {a.numel()} elements over 1% of a step"
    assert float(diff.max()) <= 2 * lr, f"an element {float(diff.max()):.3g} apart, over two steps of {lr}"


@pytest.mark.parametrize("epochs,mini_batches,prestarted", [(1, 1, False), (2, 2, True)])
def test_two_ranks_make_the_single_process_step_critic_reference_and_kl_included(
    epochs, mini_batches, prestarted, tmp_path
):
    # PPO with the KL as a loss against a reference that differs from the policy, micro-batches
    # of a few groups each: one update (fused old log-probs and values), then several, with
    # rank 1 started ahead of the phase (as during generation) and given the published weights
    # then, so that joining sends none; else it joins with rank 0's, sent.
    cfg = load_config(
        preset="tiny",
        overrides=(
            "runtime.executor=ray",
            "algorithm.name=ppo",
            "algorithm.kl_coef=0.1",
            f"algorithm.epochs={epochs}",
            f"algorithm.mini_batches={mini_batches}",
            "trainer.micro_batch_tokens=64",
            "optim.grad_clip=0.5",
            "runtime.learner_width=0",  # every free slot: two here
        ),
    )
    tokenizer = load_tokenizer(cfg.model)
    pad, vocab = tokenizer.pad_token_id, len(tokenizer)
    samples = make_samples(vocab)
    policy = load_model(cfg.model, vocab, cfg.seed)
    reference = copy.deepcopy(policy).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    single_policy, initial = copy.deepcopy(policy), copy.deepcopy(policy)
    single, single_critic = build_learner(cfg, single_policy, pad), build_critic(cfg, single_policy, pad)
    ref = single.logprobs(reference, samples)
    rewards = token_rewards(samples, None, 0.0)

    raw, want_critic = single_critic.update(samples, rewards)
    want = single.learn(samples, whiten_tokens(raw), ref)

    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    groups = len({s.uid for s in samples})
    try:
        if prestarted:
            elastic.prestart(meter, 0, groups, time.time(), ray.put(flat_weights(policy)))
            time.sleep(0.01)
        elastic.widen(meter, groups, [], time.time())
        for got_lp, want_lp in zip(
            elastic.policy_logprobs(samples), single.logprobs(policy, samples), strict=True
        ):
            close(got_lp, want_lp)
        got_raw, got_critic = elastic.critic_update(samples, rewards)
        got = elastic.learn(samples, whiten_tokens(got_raw), ref)
        elastic.save_state(tmp_path / "optimizer.pt")
        critic_state = load_learner_state(tmp_path / "optimizer.pt")["critic"]["model"]
        elastic.narrow(time.time())
        free_after = elastic.functions.cluster().nodes[0].free  # what the next step's plan sees
        _, records = meter.close_step(time.time())
    finally:
        elastic.close()

    assert got["learner/width"] == 2
    assert got["learner/weights_sent"] == (0.0 if prestarted else 1.0)
    assert got["time/rank_start"] > 0  # request to joined: what the run memory keeps
    assert free_after == 2  # rank 1's slot is free again as soon as the phase is closed
    for a, b in zip(got_raw, raw, strict=True):
        close(a, b)
    for key, value in {**want_critic, **want}.items():
        assert {**got_critic, **got}[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for a, b in zip(policy.parameters(), single_policy.parameters(), strict=True):
        weights_close(a, b, cfg.optim.lr)  # the driver's weights, loaded from rank 0
    for name, value in single_critic.model.state_dict().items():
        weights_close(critic_state[name], value, cfg.algorithm.critic_lr)
    moved = [
        float((a - b).detach().abs().max())
        for a, b in zip(policy.parameters(), initial.parameters(), strict=True)
    ]
    assert max(moved) > 1e-4  # the step is large against the tolerance

    ranks = {r["name"]: r for r in records}
    assert ranks["learner-0"]["colocated_with"] == "learner" and ranks["learner-0"]["cost"] == 0
    extra = ranks["learner-1"]
    if prestarted:
        assert extra["requested"] < ranks["learner-0"]["requested"]  # before the phase opened
    held = extra["released"] - extra["started"]
    starting = extra["ready"] - extra["started"]
    assert extra["units"] == 1 and held > 0 and extra["busy"]
    assert extra["cost"] == pytest.approx(charge(cfg.scheduler.pricing, 1.0, held, starting), rel=1e-3)


def test_a_lost_rank_costs_the_phase_its_width_not_the_step():
    """Rank 1's process dies before the update: rank 0 fails in the collective without having
    stepped, leaves the broken group and makes the whole update alone, the single-process one."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "runtime.learner_width=0"))
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    single_policy = copy.deepcopy(policy)
    advantages = [torch.full((len(s.response_ids),), s.reward - 0.5) for s in samples]
    want = build_learner(cfg, single_policy, tokenizer.pad_token_id).learn(samples, advantages, None)

    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        elastic.widen(meter, len({s.uid for s in samples}), [], time.time())
        assert len(elastic.ranks) == 2
        ray.kill(elastic.ranks[1])
        got = elastic.learn(samples, advantages, None)
        elastic.narrow(time.time())
        _, records = meter.close_step(time.time())
    finally:
        elastic.close()

    assert got["learner/width"] == 1 and got["faults/learner"] == 1
    assert got["loss/policy"] == pytest.approx(want["loss/policy"], rel=1e-4, abs=1e-6)
    for a, b in zip(policy.parameters(), single_policy.parameters(), strict=True):
        weights_close(a, b, cfg.optim.lr)
    lost = {r["name"]: r for r in records}["learner-1"]
    assert any(event["kind"] == "fault" for event in lost["events"])


@pytest.mark.parametrize("changed", [False, True])
def test_groups_learned_ahead_on_rank_1_make_the_single_process_step(changed):
    """GRPO with a KL loss: rank 1, started ahead of the phase, learns two scored groups with the
    step's published weights while (as it were) stragglers decode; the update leaves them out of
    the ranks' shares and is the single-process one. When one of their advantages is not the
    update's (`changed`), none of rank 1's ahead gradients count, and the step is still the same."""
    cfg = load_config(
        preset="tiny",
        overrides=(
            "runtime.executor=ray",
            "algorithm.kl_coef=0.1",
            "trainer.micro_batch_tokens=64",
            "runtime.learner_width=0",
        ),
    )
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    single_policy = copy.deepcopy(policy)
    advantages = [torch.full((len(s.response_ids),), s.reward - 0.5) for s in samples]
    ref = [
        -torch.rand(len(s.response_ids), generator=torch.Generator().manual_seed(i))
        for i, s in enumerate(samples)
    ]
    want = build_learner(cfg, single_policy, tokenizer.pad_token_id).learn(samples, advantages, ref)

    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    groups = len({s.uid for s in samples})
    try:
        assert elastic.ahead_rank() is None  # no rank requested yet
        elastic.prestart(meter, 0, groups, time.time())
        weights = ray.put(flat_weights(policy))
        for uid in ("u1", "u3"):
            rows = [i for i, s in enumerate(samples) if s.uid == uid]
            sent = [advantages[i] + (1.0 if changed and uid == "u3" else 0.0) for i in rows]
            elastic.learn_ahead(weights, [samples[i] for i in rows], sent, [ref[i] for i in rows])
        elastic.widen(meter, groups, [], time.time())
        got = elastic.learn(samples, advantages, ref)
        elastic.narrow(time.time())
        _, records = meter.close_step(time.time())
    finally:
        elastic.close()

    assert got["learner/width"] == 2
    assert got["learner/weights_sent"] == 0.0  # rank 1 took the published ones to learn ahead
    assert got["learn/ahead_groups"] == (0 if changed else 2)
    assert got["time/learn_ahead"] > 0
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for a, b in zip(policy.parameters(), single_policy.parameters(), strict=True):
        weights_close(a, b, cfg.optim.lr)
    extra = {r["name"]: r for r in records}["learner-1"]
    assert len(extra["busy"]) >= 2  # ahead, then in the phase: billed busy both times
    assert elastic.token_s is not None and elastic.token_s > 0


def test_a_rank_given_the_published_weights_joins_with_them_and_none_are_sent():
    """Rank 0 holds the step's published weights (here: not those a rank loads at its start); a
    rank prestarted with them joins holding exactly them, and joining sends none."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "runtime.learner_width=0"))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    published = flat_weights(policy)
    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        ref = ray.put(published)
        ray.get(elastic.rank0.take_weights.remote(ref))  # as the driver's policy is rank 0's
        elastic.prestart(meter, 0, 4, time.time(), ref)
        elastic.widen(meter, 4, [], time.time())
        joined = [
            ray.get(rank.__ray_call__.remote(lambda r: flat_weights(r.policy))) for rank in elastic.ranks
        ]
        phase, moves = dict(elastic.phase), list(meter.transfers)
        elastic.narrow(time.time())
    finally:
        elastic.close()

    assert phase["learner/width"] == 2 and phase["learner/weights_sent"] == 0.0
    (move,) = moves  # the take, recorded as one of the step's transfers
    assert (move.kind, move.target, move.bytes, move.same_node) == (
        "weights",
        "learner-1",
        published.nbytes,
        True,
    )
    assert all(np.array_equal(w, published) for w in joined)
    assert not np.array_equal(published, flat_weights(load_model(cfg.model, len(tokenizer), cfg.seed)))


def test_rank_0_has_its_optimizer_states_before_the_first_update():
    """Rank 0, the rank that steps, makes AdamW's states (zero, step 0) as the run starts
    (`learner.prime`, from the executor's `warm_up`), so that step 1's update does not pay for
    them."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "algorithm.name=ppo"))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    try:
        elastic.prime()
        states = ray.get(
            elastic.rank0.__ray_call__.remote(
                lambda r: [
                    [float(s["step"]) for s in opt.state.values()]
                    for opt in (r.learner.optimizer, r.critic.optimizer)
                ]
            )
        )
    finally:
        elastic.close()
    params = sum(1 for p in policy.parameters() if p.requires_grad)
    assert states[0] == [0.0] * params  # the policy's
    assert states[1] and set(states[1]) == {0.0}  # PPO's critic's


def test_the_phase_takes_the_width_a_budget_or_deadline_chose_in_the_steps_plan():
    """Both slots are free (the phase's own choice: two ranks), but the step's plan chose one
    rank under its budget: no rank starts, none is billed."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "runtime.learner_width=0"))
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    elastic.planned_width = 1
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        groups = len({s.uid for s in samples})
        elastic.prestart(meter, 0, groups, time.time())
        elastic.widen(meter, groups, [], time.time())
        got = elastic.learn(samples, [torch.ones(len(s.response_ids)) for s in samples], None)
        elastic.narrow(time.time())
        _, records = meter.close_step(time.time())
    finally:
        elastic.close()

    assert got["learner/width"] == 1 and len(elastic.ranks) == 1
    assert [r["name"] for r in records] == ["learner-0"]


def test_a_warm_idle_function_gives_its_slot_to_the_learning_phase():
    """A decode function released warm holds the one free slot; the phase (not yet measured: every
    slot) stops it and puts rank 1 there, rather than learning on one rank beside it idling."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "runtime.learner_width=0"))
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    functions = Functions(cfg, tokenizer, False, False, driver_node())
    elastic = ElasticLearner(cfg, policy, tokenizer, functions)
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        lease, inv = functions.acquire(meter, "decode-1", "decode", False, driver_node(), 1.0, time.time())
        functions.settle(lease, inv)
        functions.release(lease, time.time(), keep=True)
        assert functions.warm() == 1
        elastic.widen(meter, len({s.uid for s in samples}), [], time.time())
        got = elastic.learn(samples, [torch.ones(len(s.response_ids)) for s in samples], None)
        elastic.narrow(time.time())
        spans = functions.pool.take_spans(time.time())
    finally:
        elastic.close()
        functions.close()

    assert got["learner/width"] == 2
    assert got["learner/weights_sent"] == 1.0  # started as the phase opened: rank 0's sent
    assert functions.warm() == 0 and [span.lease for span in spans] == [lease]  # stopped, idle no more


def test_verl_learns_on_its_held_slot_with_one_rank_living_across_phases():
    """Under verl a rank lives on the held decode function's slot: colocated with it, billed
    through it, the same process in every phase, joined each phase with rank 0's weights, so two
    phases make the single-process two updates; once the function is no longer held, the rank is
    stopped with it."""
    cfg = load_config(
        preset="tiny",
        overrides=("runtime.executor=ray", "scheduler.policy=verl", "runtime.learner_width=0"),
    )
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    groups = len({s.uid for s in samples})
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    single_policy = copy.deepcopy(policy)
    initial = torch.from_numpy(flat_weights(policy))
    advantages = [torch.full((len(s.response_ids),), s.reward - 0.5) for s in samples]
    single = build_learner(cfg, single_policy, tokenizer.pad_token_id)
    want = [single.learn(samples, advantages, None)]
    after_one = torch.from_numpy(flat_weights(single_policy))
    want.append(single.learn(samples, advantages, None))

    functions = Functions(cfg, tokenizer, False, False, driver_node())
    elastic = ElasticLearner(cfg, policy, tokenizer, functions)
    meter = Meter(cfg.scheduler.pricing)
    got, pids, records = [], [], []
    try:
        for _ in range(2):  # two steps: the held function leased (warm the second time), then learning
            meter.begin_step(time.time())
            lease, inv = functions.acquire(
                meter, "decode-1", "decode", False, driver_node(), 1.0, time.time()
            )
            functions.settle(lease, inv)
            elastic.prestart(meter, 1, groups, time.time())  # verl starts no rank on free slots
            elastic.widen(meter, groups, [Host(lease, inv)], time.time())
            got.append(elastic.learn(samples, advantages, None))
            joined_with = torch.from_numpy(  # the resident rank's weights: it never steps
                ray.get(elastic.ranks[1].__ray_call__.remote(lambda rank: flat_weights(rank.policy))).copy()
            )
            pids.append([hello.pid for hello in ray.get([rank.hello.remote() for rank in elastic.ranks])])
            elastic.narrow(time.time())
            records.append({r["name"]: r for r in meter.close_step(time.time())[1]})
            functions.release(lease, time.time())
        resident = elastic.resident[lease].handle
        meter.begin_step(time.time())
        elastic.widen(meter, groups, [], time.time())  # the function was dropped: learning on rank 0
        alone = len(elastic.ranks)
        elastic.narrow(time.time())
        retired = not elastic.resident and stopped(resident)
    finally:
        elastic.close()
        functions.close()

    assert [g["learner/width"] for g in got] == [2, 2] and alone == 1 and retired
    assert [g["learner/weights_sent"] for g in got] == [1.0, 1.0]  # a resident's are last phase's
    assert pids[0] == pids[1] and len(set(pids[0])) == 2  # rank 0 and one resident, both phases
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            assert g[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert float((after_one - initial).abs().max()) > 1e-4
    weights_close(joined_with, after_one, cfg.optim.lr)  # the second join's
    for a, b in zip(policy.parameters(), single_policy.parameters(), strict=True):
        weights_close(a, b, cfg.optim.lr)
    for step, record in enumerate(records):
        rank = record["learner-1"]
        assert rank["colocated_with"] == "decode-1" and rank["units"] == 0 and rank["cost"] == 0
        assert rank["cold"] == (step == 0)  # started once, in the first phase
        learning = rank["busy"][0]
        assert any(a - 1e-3 <= learning[0] and learning[1] <= b + 1e-3 for a, b in record["decode-1"]["busy"])
        assert record["decode-1"]["cost"] > 0 and set(record) == {"decode-1", "learner-0", "learner-1"}


def stopped(handle, within_s: float = 60.0) -> bool:
    """Whether the actor dies within `within_s` (`ray.kill` is asynchronous: a call made just
    after it may still be served)."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            ray.get(handle.hello.remote())
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_rank_0s_weights_reach_the_driver_over_the_link_and_it_writes_its_own_state(tmp_path):
    """Sent from rank 0 tensor by tensor over the gloo pair, not the object store, the driver's
    weights are the single-process ones; so is the checkpoint's learner state, which rank 0 writes
    itself (the driver never holds it), read back as a resume reads it."""
    cfg = load_config(preset="tiny", overrides=("runtime.executor=ray", "runtime.learner_width=1"))
    tokenizer = load_tokenizer(cfg.model)
    samples = make_samples(len(tokenizer))
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    single_policy = copy.deepcopy(policy)
    advantages = [torch.full((len(s.response_ids),), s.reward - 0.5) for s in samples]
    single = build_learner(cfg, single_policy, tokenizer.pad_token_id)
    single.learn(samples, advantages, None)

    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        elastic.widen(meter, len({s.uid for s in samples}), [], time.time())
        elastic.learn(samples, advantages, None)
        elastic.narrow(time.time())
        elastic.save_state(tmp_path / "optimizer.pt")
    finally:
        elastic.close()

    whole = load_learner_state(tmp_path / "optimizer.pt")
    assert whole["version"] == 1
    state = whole["learner"]
    for a, b in zip(policy.parameters(), single_policy.parameters(), strict=True):
        weights_close(a, b, cfg.optim.lr)
    want = single.state_dict()
    assert state["scheduler"] == want["scheduler"]
    assert state["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert state["optimizer"]["state"].keys() == want["optimizer"]["state"].keys()
    for index, moments in want["optimizer"]["state"].items():
        for name, value in moments.items():
            close(state["optimizer"]["state"][index][name], value)


def test_a_zero_allocator_threshold_leaves_the_ranks_environment_as_the_jobs():
    assert rank_env(0) is None  # no runtime_env: MALLOC_MMAP_THRESHOLD_ unset, glibc's default
    assert rank_env(4096) == {"env_vars": {"MALLOC_MMAP_THRESHOLD_": "4096"}}


def test_every_rank_starts_with_the_configured_allocator_threshold():
    """`runtime.learner_mmap_threshold` reaches each rank's process environment through Ray's
    runtime_env, where glibc reads it at start."""
    cfg = load_config(
        preset="tiny",
        overrides=("runtime.executor=ray", "runtime.learner_width=0", "runtime.learner_mmap_threshold=4096"),
    )
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    elastic = ElasticLearner(cfg, policy, tokenizer, Functions(cfg, tokenizer, False, False, driver_node()))
    meter = Meter(cfg.scheduler.pricing)
    meter.begin_step(time.time())
    try:
        elastic.widen(meter, 2, [], time.time())
        pids = [hello.pid for hello in ray.get([rank.hello.remote() for rank in elastic.ranks])]
        environments = [psutil.Process(pid).environ() for pid in pids]
        elastic.narrow(time.time())
    finally:
        elastic.close()

    assert len(pids) == 2
    assert [env.get("MALLOC_MMAP_THRESHOLD_") for env in environments] == ["4096", "4096"]


def driver_node() -> str:
    return ray.get_runtime_context().get_node_id()


def test_a_run_saved_at_two_ranks_resumes_at_one(tmp_path):
    base = (
        "runtime.executor=ray",
        "trainer.steps=2",
        "trainer.progress=false",
        "trainer.tensorboard=false",
        "generation.max_new_tokens=8",
    )
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train(load_config(preset="tiny", overrides=(*base, f"output_dir={whole}", "runtime.learner_width=2")))
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000002")
    train(
        load_config(
            preset="tiny",
            overrides=(*base, f"output_dir={resumed}", "runtime.learner_width=1", "resume=true"),
        )
    )
    rows = {
        name: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for name, d in (("whole", whole), ("resumed", resumed))
    }
    assert [r["learner/width"] for r in rows["whole"]] == [2, 2]
    assert [r["learner/width"] for r in rows["resumed"]] == [2, 1]
    assert rows["resumed"][1]["loss/policy"] == pytest.approx(rows["whole"][1]["loss/policy"], rel=1e-4)
    a = load_file(whole / "checkpoints" / "step_000002" / "model.safetensors")
    b = load_file(resumed / "checkpoints" / "step_000002" / "model.safetensors")
    assert a.keys() == b.keys()
    lr = load_config(preset="tiny").optim.lr
    for name in a:
        weights_close(b[name], a[name], lr)  # two Adam steps over gradients summed in another order
