"""A step's plan timed again at other response lengths: the lengths its samples drew, to learn
what the time model misses (`forecast.Calibration`), and its own predictions beside verl's plan
or the best single size's, to learn how much further short its forecasts fall
(`forecast.Shortfall`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.planner.step_plan import StepPlan
from rlhfless.planner.tail import Tail, plan_end
from rlhfless.planner.timemodel import RangeModel, Workload
from rlhfless.planner.verl_time import even_split_seconds, verl_workload


def replay_times(
    plan: StepPlan,
    observed: dict[str, Sequence[int]],
    prompt_tokens: dict[str, int],
    profile: Profile,
    segments: int = 16,
) -> tuple[np.ndarray, np.ndarray]:
    """(busy seconds, busy + start delay seconds) of each of the plan's actors as `profile`
    times its prompts at their observed response lengths (`observed`: uid -> sample lengths)."""
    order = [uid for a in plan.actors for uid in a.uids]
    if not order:
        return np.zeros(0), np.zeros(0)
    g = max(len(observed[u]) for u in order)
    lengths = [np.asarray(observed[u], dtype=float) for u in order]
    gmax, gmean = np.array([x.max() for x in lengths]), np.array([x.mean() for x in lengths])
    plen = np.array([prompt_tokens[u] for u in order], dtype=float)
    busy, total, _ = _actor_times(plan, gmax, gmean, plen, g, profile, segments)
    return busy, total


def _actor_times(
    plan: StepPlan,
    gmax: np.ndarray,
    gmean: np.ndarray,
    plen: np.ndarray,
    g: int,
    profile: Profile,
    segments: int,
    tail: Tail | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """`replay_times` from per-prompt figures in the plan's actor order (`tail`: where they are
    predicted ones, the run's tail the plan was timed with), and when the last actor is expected
    to end (`tail.expected_end`)."""
    own = np.array([a.prefill_tokens for a in plan.actors], dtype=float)
    sizes = np.array([len(a.uids) for a in plan.actors])
    # Each actor's own prefill, spread over its prompts so that ranges sum back to it.
    per_prompt = np.repeat(own / np.maximum(sizes, 1), sizes)
    workload = Workload(gmax, gmean, plen, per_prompt, np.zeros(plen.size), g, tail)
    ends = np.cumsum(sizes)
    model = RangeModel(workload, np.arange(plen.size), profile, segments, blocks=ends - sizes)
    actors = np.arange(sizes.size)
    parts = model.times(actors, actors + 1)
    busy = parts["decode"] + parts["prefill"]
    delay = np.array([a.start_delay for a in plan.actors], dtype=float)
    return busy, busy + delay, plan_end(busy + delay, parts)


def versus_verl(
    plan: StepPlan,
    observed: np.ndarray,
    prompt_tokens: np.ndarray,
    profile: Profile,
    segments: int = 16,
    verl_profile: Profile | None = None,
) -> tuple[float, float] | None:
    """The plan's generation time over verl's plan of the same step (`plan.verl_actors` actors of
    `verl_profile`, default `profile`): (at the predicted response lengths, at the observed ones).
    The plan's actors are timed by `profile`, a split's parts each by its own size's. `observed`
    (prompts x samples) and `prompt_tokens` are in the plan's input order. The second over the
    first is how much further short the plan's forecast fell than verl's would have, from the
    lengths alone (`Margins.shortfall`); None when no verl plan capped this one."""
    if not plan.verl_actors or plan.predicted_mean is None or not plan.actors:
        return None
    plen, g = np.asarray(prompt_tokens, dtype=float), observed.shape[1]
    ratios = []
    for predicted, (gmax, gmean) in zip(
        (True, False), _lengths(plan, plan.predicted_mean, observed), strict=True
    ):
        ours = _generation_s(plan, (gmax, gmean), plen, g, profile, segments, predicted)
        tail = plan.tail if predicted else None
        verl = verl_workload(Workload(gmax, gmean, plen, plen, plen * 0.0, g, tail))
        verl_s = even_split_seconds(verl, plan.verl_actors, verl_profile or profile, segments)
        ratios.append(ours / verl_s)
    return ratios[0], ratios[1]


def versus_single(
    split: StepPlan,
    single: StepPlan,
    predicted_mean: np.ndarray,
    observed: np.ndarray,
    prompt_tokens: np.ndarray,
    profile: Profile,
    segments: int = 16,
) -> tuple[float, float]:
    """A split's generation time over the best single size's plan of the same step (`plan_shapes`
    weighed both): (at the predicted response lengths, at the observed ones), each actor timed by
    its own size's profile (`profile` where a plan holds none). The second over the first is how
    much further short the split's forecast fell than the single size's would have
    (`Billing.split_shortfall`). `predicted_mean`, `observed` (prompts x samples) and
    `prompt_tokens` are in the plans' input order."""
    plen, g = np.asarray(prompt_tokens, dtype=float), observed.shape[1]
    ratios = []
    for predicted, lengths in zip((True, False), _lengths(split, predicted_mean, observed), strict=True):
        ours = _generation_s(split, lengths, plen, g, profile, segments, predicted)
        ratios.append(ours / _generation_s(single, lengths, plen, g, profile, segments, predicted))
    return ratios[0], ratios[1]


def _lengths(
    plan: StepPlan, predicted_mean: np.ndarray, observed: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(group max, group mean) at the plan's predicted lengths and at the observed ones, in the
    plan's input order."""
    predicted = np.fromiter(plan.predicted_length.values(), dtype=float, count=len(plan.predicted_length))
    return (predicted, predicted_mean), (observed.max(axis=1), observed.mean(axis=1))


def _generation_s(
    plan: StepPlan,
    lengths: tuple[np.ndarray, np.ndarray],
    plen: np.ndarray,
    g: int,
    profile: Profile,
    segments: int,
    predicted: bool,
) -> float:
    """The plan's generation (its latest actor, start delay included) at these per-prompt group
    max and mean (`lengths`, input order); a split's parts each timed by its own size's profile.
    `predicted`: the lengths are the plan's own predictions, timed with its tail as it was."""
    gmax, gmean = lengths
    position = {u: i for i, u in enumerate(plan.predicted_length)}
    ends = []
    for part in plan.pools or [plan]:
        at = np.array([position[u] for a in part.actors for u in a.uids])
        tail = part.tail if predicted else None
        ends.append(
            _actor_times(part, gmax[at], gmean[at], plen[at], g, part.profile or profile, segments, tail)[2]
        )
    return max(ends)
