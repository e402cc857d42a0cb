"""How many prompts of each data source the length pilot samples before the first step.

The pilot lets the first plan start from measured lengths. One prompt's group teaches its source a
typical length. Whether the source's ground-truth answers rank its prompts
(`source_lengths.SourceLengths.answers_fit`) needs groups judged by the others, `ANSWER_GROUPS` of
them: with fewer, the first step gives every prompt of a source the same length, and sorted
assignment has nothing to sort. Where an actor's decode step is bound by reading its weights (a GPU
at small batch), more prompts cost the pilot little per step, so it samples as many as decode at most
`SLOWER` times the step of the prompts asked for, up to `MOST` a source. On a CPU slot the step
grows with the batch at once, and the pilot keeps to what `scheduler.length_pilot` asks.

On a cluster of more decode actors than `JUDGED`, the pilot samples at least `JUDGED` prompts a source,
in waves where the actor's memory holds fewer. With fewer, the first step predicts every prompt of
a source the same length, and cut-and-migrate must find its longest prompts. On `bench_floor.py`'s
scenarios whose pilot had sampled 1 or 2 prompts, the first step's generation cost 15-110% more
than with 4-5, while the pilot itself cost at most 0.05 $ more. The pilot runs on one actor, a
small share of a step that runs on many. On this machine's two CPU slots, by contrast, each prompt
costs 35-170 s, about a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlhfless.planner.profile import Profile
from rlhfless.planner.source_lengths import ANSWER_GROUPS

MOST = 16  # prompts a source at most, however flat the decode step
SLOWER = 1.1  # a wider pilot's decode step, at most this times the asked-for one's
JUDGED = ANSWER_GROUPS + 1  # prompts a source on a cluster: the answer rule's groups, one to spare


def pilot_context(prompt_tokens: Sequence[int], cap: float) -> float:
    """The context the pilot's batch is priced at, before any length is known: the mean prompt's
    tokens (`prompt_tokens`: one length a prompt) and half the response cap."""
    return float(np.mean(prompt_tokens)) + cap / 2


def pilot_prompts(profile: Profile, at_least: int, group_size: int, context: float, actors: int = 1) -> int:
    """Prompts of each source to sample G = `group_size` times: `at_least` (0: no pilot), or more
    while every wider batch (up to `MOST` prompts, within the KV memory at `context` tokens a
    sequence) decodes a step at most `SLOWER` times as long as `at_least` prompts' batch; and at
    least `JUDGED` where the cluster holds more decode actors than that (`actors`)."""
    if at_least <= 0 or at_least >= MOST:
        return max(at_least, 0)
    fit = int(profile.concurrency(context)) // max(group_size, 1)
    prompts = np.arange(at_least, max(at_least, min(MOST, fit)) + 1)
    steps = profile.decode_step_seconds(prompts * group_size, context)
    within = np.cumprod(steps <= SLOWER * steps[0]).astype(bool)  # every narrower one fits too
    wide = int(prompts[within].max())
    return max(wide, JUDGED) if actors > JUDGED else wide
