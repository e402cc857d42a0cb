"""Admission inside a decode actor: which queued sequence takes the next free slot.

An actor that holds more sequences than it can decode at once (KV memory, the engine's batch
limit) runs them in waves: a queued sequence starts when a running one ends, and the actor ends
when its last sequence does. Longest first lets short sequences backfill the tail; what is
longest is learned within the step from a prompt's other samples, whose lengths are strongly
correlated (one prompt's samples differ by ~10% in log length, prompts by 45-80%):

- a sample of the prompt has finished: the queued ones are about as long (the mean of those
  finished);
- samples are running, none finished: the prompt is at least as long as they have got so far;
- none started: the planner's prediction.

`initial_order` puts one sample of every prompt ahead of the prompts' other samples (`probes`),
so that each prompt starts telling its length as early as the slots allow; `estimates` is what
the engine (or the simulator) ranks its queue by whenever slots free. Both are pure functions of
what the actor has seen, so the simulator and the runtime's engine admit alike.
"""

from __future__ import annotations

import numpy as np


def initial_order(predicted: np.ndarray, group: np.ndarray, probes: bool) -> np.ndarray:
    """Queue order of an actor's sequences: longest predicted first (stable: ties keep the input
    order); with `probes`, one sample of every prompt first, then the rest, each part so."""
    n = predicted.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if not probes:
        return np.argsort(-predicted, kind="stable")
    by_group = np.argsort(group, kind="stable")
    first = np.ones(n, dtype=bool)
    first[by_group[1:]] = group[by_group[1:]] != group[by_group[:-1]]
    rank = np.lexsort((np.arange(n), -predicted, ~first))
    return rank


def estimates(
    predicted: np.ndarray,
    finished_sum: np.ndarray,
    finished_count: np.ndarray,
    running_for: np.ndarray,
) -> np.ndarray:
    """Estimated length of each queued sequence from its prompt's other samples: `predicted`,
    its prediction; `finished_sum` / `finished_count`, the lengths of the prompt's finished
    samples; `running_for`, the tokens its longest-running sibling has generated so far (read
    only while none has finished; 0: none running)."""
    known = finished_count > 0
    mean = np.divide(finished_sum, np.maximum(finished_count, 1))
    return np.where(known, mean, np.maximum(predicted, running_for))
