"""Live cut-and-migrate decisions, called by the runtime while decode actors run.

Per-actor cut (RLHFless): an actor whose finished share reached tau is cut; each of its unfinished
sequences (most remaining predicted work first) moves to the running, not-cut actor with free slots
and the least remaining predicted work; with no such actor it stays. Global cut (RLHFuse-like
baseline): once tau of all responses finished, every actor is cut together and the stragglers are
gathered on the fewest actors that can hold them. Both are stateless: calling again after the moves
were carried out proposes nothing new unless progress changed.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlhfless.planner.config import SchedulerConfig


@dataclass
class ActorProgress:
    """What the runtime knows about one decode actor right now."""

    actor: int
    finished: int  # responses finished on this actor
    total: int  # responses assigned to it (including migrated in)
    free_slots: int  # sequences it could take on now
    running: bool  # still alive (not released)
    remaining: Mapping[str, float]  # unfinished sequence id -> remaining predicted tokens


@dataclass(frozen=True)
class Migration:
    sequence: str
    source: int
    target: int


def _is_cut(p: ActorProgress, tau: float) -> bool:
    return p.running and p.total > 0 and p.finished >= tau * p.total and len(p.remaining) > 0


def _move(sources: Sequence[ActorProgress], targets: Sequence[ActorProgress]) -> list[Migration]:
    """Longest stragglers first, each to the target with the least remaining work and a free slot.

    Ties between equally long stragglers: lower source actor first, then the source's listing order.
    """
    heap = [(sum(t.remaining.values()), t.actor, t.free_slots) for t in targets if t.free_slots > 0]
    if not heap:
        return []
    heapq.heapify(heap)
    names: list[str] = []
    work: list[float] = []
    owner: list[int] = []
    for p in sources:
        names.extend(p.remaining)
        values = list(p.remaining.values())
        work.extend(values)
        owner.extend([p.actor] * len(values))
    budget = sum(free for _, _, free in heap)
    order = np.lexsort((np.arange(len(work)), owner, -np.asarray(work, dtype=float)))[:budget]
    moves = []
    for k in order.tolist():
        load, target, free = heapq.heappop(heap)
        moves.append(Migration(names[k], owner[k], target))
        if free > 1:
            heapq.heappush(heap, (load + work[k], target, free - 1))
    return moves


def decide_migrations(progress: Sequence[ActorProgress], config: SchedulerConfig) -> list[Migration]:
    """Per-actor cut at tau; targets are running actors not themselves cut."""
    cut = [p for p in progress if _is_cut(p, config.tau)]
    cut_ids = {p.actor for p in cut}
    targets = [p for p in progress if p.running and p.actor not in cut_ids]
    return _move(cut, targets)


def decide_global_cut(progress: Sequence[ActorProgress], config: SchedulerConfig) -> list[Migration]:
    """Global cut: when tau of all responses finished, gather stragglers on the fewest actors."""
    running = [p for p in progress if p.running]
    finished = sum(p.finished for p in progress)
    total = sum(p.total for p in progress)
    if total == 0 or finished < config.tau * total:
        return []
    stragglers = sum(len(p.remaining) for p in running)
    # Keepers: most room (own stragglers + free slots) first; that room is unchanged by moves,
    # so a repeated call picks the same keepers and proposes nothing new.
    by_room = sorted(running, key=lambda p: (-(len(p.remaining) + p.free_slots), p.actor))
    keepers, room = [], 0
    for p in by_room:
        if room >= stragglers:
            break
        keepers.append(p)
        room += len(p.remaining) + p.free_slots
    keeper_ids = {p.actor for p in keepers}
    sources = [p for p in running if p.actor not in keeper_ids and p.remaining]
    return _move(sources, keepers)


def decide(progress: Sequence[ActorProgress], config: SchedulerConfig) -> list[Migration]:
    """The configured policy's decision: per-actor cut, global cut, or none."""
    cut = config.features["cut"]
    if cut == "actor":
        return decide_migrations(progress, config)
    if cut == "global":
        return decide_global_cut(progress, config)
    return []
