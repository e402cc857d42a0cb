"""Properties of the schedule that aims at the floor: assignment, admission order, migration gain."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner import ActorProgress, LengthPredictor, PromptSpec, SchedulerConfig, decide, plan_step
from rlhfless.planner.hardware import roofline_profile
from rlhfless.planner.migration import _drain_s, _line
from tests.planner.planner_support import make_cluster, make_profile

CONFIGS = {
    "rlhfless": SchedulerConfig(),
    "lpt": SchedulerConfig(assignment_method="lpt"),
    "paper": SchedulerConfig(balance_rounds=0, longest_first=False, migration="paper"),
    "verl": SchedulerConfig(policy="verl"),
}


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=60),
    g=st.integers(1, 16),
    policy=st.sampled_from(sorted(CONFIGS)),
)
def test_every_prompt_is_assigned_exactly_once_longest_first(lengths, g, policy):
    config = CONFIGS[policy]
    predictor = LengthPredictor()
    prompts = [PromptSpec(f"p{i}", [1, 2, i + 3]) for i in range(len(lengths))]
    for p, n in zip(prompts, lengths, strict=True):
        predictor.update(p.uid, [n] * g)
    plan = plan_step(prompts, predictor, make_profile(per_seq_ms=0.05), make_cluster(), config, g)
    assigned = [u for a in plan.actors for u in a.uids]
    assert sorted(assigned) == sorted(p.uid for p in prompts)
    if config.features["longest_first"]:
        for a in plan.actors:
            predicted = [plan.predicted_length[u] for u in a.uids]
            assert predicted == sorted(predicted, reverse=True)
    assert plan.floor["time_s"] >= plan.floor["latency_s"] > 0


PROFILE = roofline_profile("qwen2.5-3b", "l40s", 1)


def _finish(profile, tokens: float, batch: int, context: float) -> float:
    """Seconds to decode `tokens` more at `batch` running sequences, the batch held."""
    return tokens * profile.step_seconds(max(batch, 1), context)


@st.composite
def actors(draw):
    n = draw(st.integers(2, 6))
    out = []
    for i in range(n):
        left = draw(st.lists(st.floats(1, 2000), min_size=0, max_size=30))
        total = len(left) + draw(st.integers(0, 60))
        out.append(
            ActorProgress(
                actor=i,
                finished=total - len(left),
                total=total,
                free_slots=draw(st.integers(0, 40)),
                running=bool(left) or draw(st.booleans()),
                remaining={f"{i}-{k}": w for k, w in enumerate(left)},
                context=draw(st.floats(1, 3000)),
            )
        )
    return out


@settings(max_examples=150, deadline=None)
@given(progress=actors(), tau=st.floats(0.1, 1.0), resume=st.floats(0, 2))
def test_no_migration_makes_a_migrant_finish_later_and_none_moves_twice(progress, tau, resume):
    config = SchedulerConfig(tau=tau)
    moves = decide(progress, config, PROFILE, resume)
    by_id = {p.actor: p for p in progress}
    batch = {p.actor: len(p.remaining) for p in progress}
    for m in moves:
        batch[m.source] -= 1
        batch[m.target] += 1
    assert len({m.sequence for m in moves}) == len(moves)
    for m in moves:
        src, dst = by_id[m.source], by_id[m.target]
        work = src.remaining[m.sequence]
        stay = _finish(PROFILE, work, len(src.remaining), src.context)
        there = resume + _finish(PROFILE, work, batch[m.target], dst.context)
        assert there <= stay * (1 + 1e-9), (m, stay, there)
        assert dst.running and m.target != m.source
    moved = [
        ActorProgress(
            p.actor,
            p.finished,
            p.total,
            p.free_slots,
            p.running,
            p.remaining,
            p.context,
            frozenset(p.remaining),
        )
        for p in progress
    ]
    assert decide(moved, config, PROFILE, resume) == []


@settings(max_examples=150, deadline=None)
@given(progress=actors(), tau=st.floats(0.1, 1.0), resume=st.floats(0, 2))
def test_no_receiver_is_predicted_to_drain_after_the_step(progress, tau, resume):
    """Held at its batch every busy actor looks as late as the step, so receivers could be loaded
    until they set its end; draining (each migrant's resume waited for), none passes it."""
    moves = decide(progress, SchedulerConfig(tau=tau), PROFILE, resume)

    def drain(remaining: list[float], context: float) -> float:
        return _drain_s(_line(PROFILE, len(remaining), context), max(remaining, default=0.0), sum(remaining))

    step_end = max(drain(list(p.remaining.values()), p.context) for p in progress)
    by_id = {p.actor: p for p in progress}
    for a in {m.target for m in moves}:
        p = by_id[a]
        incoming = [by_id[m.source].remaining[m.sequence] for m in moves if m.target == a]
        left = {m.sequence for m in moves if m.source == a}
        own = [w for name, w in p.remaining.items() if name not in left]
        after = drain([*own, *incoming], p.context)
        assert resume * len(incoming) + after <= step_end * (1 + 1e-9) + 1e-9


def test_draining_is_exact_for_a_batch_that_never_shrinks_and_cheaper_for_one_that_does():
    one = float(PROFILE.decode_step_seconds(1, 500.0))
    eight = float(PROFILE.decode_step_seconds(8, 500.0))
    assert np.isclose(_drain_s(_line(PROFILE, 1, 500.0), 100.0, 100.0), 100 * one)
    assert np.isclose(_drain_s(_line(PROFILE, 8, 500.0), 100.0, 800.0), 100 * eight)
    # One of 100 tokens and seven of 10: 10 steps at batch 8, then 90 alone.
    assert np.isclose(_drain_s(_line(PROFILE, 8, 500.0), 100.0, 170.0), 10 * eight + 90 * one)


@settings(max_examples=150, deadline=None)
@given(progress=actors(), tau=st.floats(0.1, 1.0), resume=st.floats(0, 2))
def test_gathering_empties_whole_cut_actors_without_ending_the_step_later_and_stops(progress, tau, resume):
    config = SchedulerConfig(tau=tau, migration="gather")
    moves = decide(progress, config, PROFILE, resume)
    by_id = {p.actor: p for p in progress}
    step = {
        p.actor: _finish(PROFILE, max(p.remaining.values(), default=0.0), len(p.remaining), p.context)
        for p in progress
    }
    step_end = max(step.values())
    sources = {m.source for m in moves}
    targets = {m.target for m in moves}
    assert not sources & targets and len({m.sequence for m in moves}) == len(moves)
    for a in sources:  # all of a cut actor's stragglers leave, so it can be released
        p = by_id[a]
        assert p.finished >= tau * p.total
        assert {m.sequence for m in moves if m.source == a} == set(p.remaining)
    for a in targets:  # within its room, and neither it nor its migrants end after the step
        p = by_id[a]
        incoming = [by_id[m.source].remaining[m.sequence] for m in moves if m.target == a]
        assert p.running and len(incoming) <= p.free_slots
        batch = len(p.remaining) + len(incoming)
        own = _finish(PROFILE, max(p.remaining.values(), default=0.0), batch, p.context)
        migrants = resume + _finish(PROFILE, max(incoming), batch, p.context)
        assert max(own, migrants) <= step_end * (1 + 1e-9)
    for _ in range(len(progress)):  # carried out and asked again: each round empties an actor
        if not moves:
            break
        progress = _carry_out(progress, moves)
        moves = decide(progress, config, PROFILE, resume)
    assert moves == []


def _carry_out(progress: list[ActorProgress], moves) -> list[ActorProgress]:
    """The progress after `moves`: migrants on their targets (marked moved), sources emptied."""
    remaining = {p.actor: dict(p.remaining) for p in progress}
    migrated = {p.actor: set(p.migrated) for p in progress}
    for m in moves:
        remaining[m.target][m.sequence] = remaining[m.source].pop(m.sequence)
        migrated[m.target].add(m.sequence)
        migrated[m.source].discard(m.sequence)
    out = []
    for p in progress:
        gained = sum(m.target == p.actor for m in moves) - sum(m.source == p.actor for m in moves)
        out.append(
            ActorProgress(
                p.actor,
                p.finished,
                p.total + gained,
                max(0, p.free_slots - max(gained, 0)),
                p.running and bool(remaining[p.actor]),
                remaining[p.actor],
                p.context,
                frozenset(migrated[p.actor]),
            )
        )
    return out


def test_a_straggler_moves_to_a_drained_actor_not_a_busy_one():
    profile = roofline_profile("qwen2.5-7b", "l40s", 1)
    busy = ActorProgress(0, 10, 400, 50, True, {f"b{k}": 100.0 for k in range(390)}, 800.0)
    drained = ActorProgress(1, 95, 100, 50, True, {f"d{k}": 100.0 for k in range(5)}, 800.0)
    cut = ActorProgress(2, 700, 1000, 0, True, {f"c{k}": 300.0 for k in range(300)}, 800.0)
    moves = decide([busy, drained, cut], SchedulerConfig(tau=0.7, lam=1.0), profile, 0.01)
    assert moves and {m.target for m in moves} == {1}
    assert {m.sequence for m in moves} <= set(cut.remaining)


def _cut_source(stragglers: int, work: float) -> ActorProgress:
    return ActorProgress(0, 90, 100, 0, True, {f"s{k}": work for k in range(stragglers)})


def test_between_equally_fast_targets_the_first_listed_takes_the_straggler():
    # Steps of 10 ms + 1 ms a sequence: the cut actor's ten stragglers step at 20 ms, either
    # receiver at 12 ms with one more. Each move slows its receiver, so they alternate.
    profile = make_profile(step_ms=10, per_seq_ms=1)
    a, b = (ActorProgress(i, 0, 1, 5, True, {f"own{i}": 20.0}) for i in (1, 2))
    config = SchedulerConfig(tau=0.7, lam=1.0)
    first = [m.target for m in decide([_cut_source(10, 100.0), a, b], config, profile)]
    swapped = [m.target for m in decide([_cut_source(10, 100.0), b, a], config, profile)]
    assert first[:4] == [1, 2, 1, 2] and swapped[:4] == [2, 1, 2, 1]


def test_the_fastest_receiver_is_passed_over_where_it_would_end_after_the_step():
    # Actor 1 steps fastest with one more sequence, but its one long sequence ends just before the
    # cut actor's stragglers: any migrant would end the step later. Actor 2, slower, takes them.
    profile = make_profile(step_ms=10, per_seq_ms=1)
    longest = ActorProgress(1, 0, 1, 5, True, {"long": 90.0})
    short = ActorProgress(2, 0, 3, 5, True, {f"own{k}": 5.0 for k in range(3)})
    moves = decide([_cut_source(10, 50.0), longest, short], SchedulerConfig(tau=0.7, lam=1.0), profile)
    assert moves and {m.target for m in moves} == {2}


def test_the_floor_is_the_larger_bound_and_the_work_floor_is_priced():
    from rlhfless.planner.floor import generation_floor
    from rlhfless.planner.pricing import Pricing

    profile = make_profile(step_ms=10.0, per_seq_ms=0.01, max_kv_tokens=10_000)
    floor = generation_floor([(profile, 4)], np.full(8, 100), np.r_[np.full(7, 10), 1000], 500, Pricing(3.6))
    assert floor.latency_s == np.float64(1000 * 0.01001)
    assert floor.time_s == max(floor.latency_s, floor.throughput_s)
    assert floor.work_cost == floor.work_gpu_s / 1000  # 3.6 $/h = 0.001 $/s
