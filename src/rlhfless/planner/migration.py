"""Live cut-and-migrate decisions, called by the runtime while decode actors run.

Per-actor cut (RLHFless): an actor whose finished share reached tau is cut. Given the actors' time
table (`profile`), a straggler moves only where it gains (`_gain_moves`): to the running actor on
which it finishes soonest, counting the resume (`resume_s`) and that actor's slower steps with it,
and only when that is sooner than staying and does not push the receiver's end past the step's
predicted end. Ends are predicted as the batch drains (`_drain_s`), not at the batch held: held,
every busy actor looks as late as the step and receivers were loaded until they set its end. A
sequence that moved once never moves again (`ActorProgress.migrated`). With
`scheduler.migration=gather`, a cut actor is emptied instead, when all its stragglers fit elsewhere
without the step ending later, so that it can be released (`_gather_moves`). Without a
profile, or with `scheduler.migration=paper`, the paper's rule holds: each unfinished sequence (most remaining predicted work first)
moves to the running, not-cut actor with free slots and the least remaining predicted work. Global cut (RLHFuse-like
baseline): once tau of all responses finished, every actor is cut together and the stragglers are
gathered on the fewest actors that can hold them. Both are stateless: calling again after the moves
were carried out proposes nothing new unless progress changed.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.profile import Profile


@dataclass
class ActorProgress:
    """What the runtime knows about one decode actor right now."""

    actor: int
    finished: int  # responses finished on this actor
    total: int  # responses assigned to it (including migrated in)
    free_slots: int  # sequences it could take on now
    running: bool  # still alive (not released)
    remaining: Mapping[str, float]  # unfinished sequence id -> remaining predicted tokens
    context: float = 0.0  # mean context of its running sequences (tokens), for the step time
    migrated: frozenset[str] = frozenset()  # of `remaining`, the sequences that moved here already
    slots: int = 0  # sequences it decodes at once (KV memory, batch limit); 0: all it holds


def remaining_tokens(
    predicted: Any, generated: Any, cap: float | None = None, overrun: Sequence[float] = ()
) -> Any:
    """Predicted tokens an unfinished sequence has left (at least 1): its predicted length less
    what it generated, or, once it outlived that prediction, what the last step's sequences that
    reached as far went on to: with `overrun` (the samples over their group's planned max, as ratios
    to it, `LengthPredictor.overrun`), the mean of `min(cap, r x predicted)` over the ratios r past what
    it generated; where none reached that far, or none were measured, up to the cap on response
    length (`cap`, the engine's max_new_tokens; without one, 1 token).

    Counted as ending at once, such sequences made the runtime's live forecast of generation's end
    early: in an 8-step default run (steps 2-8), 20 of the 26 responses longer than their group's
    predicted max ran to the 160-token cap, and the learner's extra rank was ready 1.6-4.7 s
    before generation ended, billed and idle (`planner.learning.generation_left_s`); the ratios
    say so too. Under a long cap most stop well short of it: priced to a 4,096-token cap on a
    simulated GPQA-like step, they looked like the step's last sequences to the gain rule.
    Broadcasts over numpy arrays."""
    predicted, generated = np.asarray(predicted, dtype=float), np.asarray(generated, dtype=float)
    outlived = generated >= predicted
    beyond = np.broadcast_to((cap - generated) if cap else 0.0, outlived.shape).astype(float)
    if len(overrun) and outlived.any():
        p, g = np.broadcast_to(predicted, outlived.shape)[outlived], generated[outlived]
        reach = np.multiply.outer(p, np.asarray(overrun, dtype=float))  # (outlived, ratios)
        past = reach > g[:, None]
        ends = np.where(past, np.minimum(reach, cap) if cap else reach, 0.0)
        count = past.sum(axis=1)
        beyond[outlived] = np.where(count > 0, ends.sum(axis=1) / np.maximum(count, 1) - g, beyond[outlived])
    out = np.maximum(np.where(outlived, beyond, predicted - generated), 1.0)
    return float(out) if out.ndim == 0 else out


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


def _line(profile: Profile, batch: int, context: float) -> tuple[float, float]:
    """(alpha, beta) of a decode step alpha + beta * batch, read from the profile between batch 1
    and `batch`."""
    one = profile.step_seconds(1, context)
    full = profile.step_seconds(max(batch, 2), context)
    beta = max(full - one, 0.0) / (max(batch, 2) - 1)
    return one - beta, beta


def _drain_s(line: tuple[float, float], longest: float, tokens: float) -> float:
    """Predicted seconds until an actor's last sequence ends as its batch drains: with a step of
    alpha + beta * batch (`line`, `_line` at the batch it starts from), the `longest` steps cost
    alpha each and every token beta (exact for a step linear in the batch)."""
    alpha, beta = line
    return alpha * longest + beta * tokens


def _gain_moves(
    sources: Sequence[ActorProgress],
    targets: Sequence[ActorProgress],
    profile: Profile,
    resume_s: float,
    lam: float = 1.0,
    elapsed_s: float = 0.0,
) -> list[Migration]:
    """Stragglers (most remaining first) to the target where each finishes soonest, if sooner than
    staying, with room, and without the receiver's draining end (its migrants' resumes included)
    passing the step's predicted draining end; a later migrant never slows a target past what its
    earlier migrants gain (no piling on). A straggler of a source that decodes its sequences in
    one batch moves only where the move is worth it by the plan's own measure (`_Ledger.worth`):
    leaving an actor that does not end the step shortens nothing, while the receiver bills for
    every step it then decodes. A source that still queues sequences is exempt: its drain, read
    as one batch, is short of what its waves take."""
    if not sources or not any(t.free_slots > 0 for t in targets):
        return []
    actors = {p.actor: p for p in (*sources, *targets)}
    batch = {a: len(p.remaining) for a, p in actors.items()}
    longest = {a: max(p.remaining.values(), default=0.0) for a, p in actors.items()}
    tokens = {a: float(sum(p.remaining.values())) for a, p in actors.items()}
    stall = dict.fromkeys(actors, 0.0)  # resumes a receiver may wait for (re-prefilled migrants)
    free = {t.actor: t.free_slots for t in targets}

    def step_s(a: int, extra: int) -> float:
        return profile.step_seconds(max(batch[a] + extra, 1), actors[a].context)

    lines: dict[tuple[int, int], tuple[float, float]] = {}  # (actor, batch) -> `_line`, read once

    def line(a: int, k: int) -> tuple[float, float]:
        if (a, k) not in lines:
            lines[a, k] = _line(profile, k, actors[a].context)
        return lines[a, k]

    def drain(a: int, work: float = 0.0) -> float:
        """`_drain_s` of actor `a` with `work` more tokens in one more sequence."""
        return stall[a] + _drain_s(line(a, batch[a] + (work > 0)), max(longest[a], work), tokens[a] + work)

    def drain_without(a: int, work: float, rest: float) -> float:
        """`drain` of actor `a` once a straggler of `work` tokens left it, its longest then `rest`."""
        if batch[a] == 1:
            return stall[a]
        return stall[a] + _drain_s(line(a, batch[a] - 1), rest, tokens[a] - work)

    ledger = _Ledger({a: drain(a) for a in actors}, lam, elapsed_s)
    step_end = ledger.top[0][1]
    left = {p.actor: sorted(p.remaining.values(), reverse=True) for p in sources}  # longest first
    queued = {p.actor for p in sources if 0 < p.slots < len(p.remaining)}
    here = {p.actor: step_s(p.actor, 0) for p in sources}  # a source's step, as its batch shrinks
    there = {a: step_s(a, 1) for a in free}  # a target's step with one more sequence
    slowest = dict.fromkeys(free, float("inf"))  # the step a target's migrants can bear
    candidates = sorted(
        (
            (w, p.actor, k, name)
            for p in sources
            for k, (name, w) in enumerate(p.remaining.items())
            if name not in p.migrated
        ),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    position = {a: i for i, a in enumerate(free)}

    def open_targets() -> list[tuple[float, int, int]]:
        """Targets with room whose step its migrants can bear, fastest first (then in order)."""
        return sorted(
            (there[a], position[a], a) for a, room in free.items() if room > 0 and there[a] <= slowest[a]
        )

    ranked = open_targets()  # changes only with a move
    # A source whose straggler was not worth moving is weighed again only once a move changed the
    # step's latest ends: its other stragglers are shorter and leave its longest where it is.
    moves, refused = [], {}  # source -> the latest ends when it was refused
    for work, source, _, name in candidates:
        if refused.get(source) == ledger.top:
            continue
        # The target where it finishes soonest, the first in order among equals, that keeps the
        # step's end: along `ranked` the finish never falls, so the scan stops once it passes.
        best, best_at, best_pos = None, work * here[source], len(position)
        for th, pos, a in ranked:
            if a == source:
                continue
            at = resume_s + work * th
            if at > best_at or (at == best_at and best is None):
                break
            if at == best_at and pos > best_pos:
                continue
            if resume_s + drain(a, work) <= step_end:
                best, best_at, best_pos = a, at, pos
        if best is None:
            continue
        mine = left[source]  # the source's longest once this straggler left
        rest = (mine[1] if len(mine) > 1 else 0.0) if mine[0] == work else mine[0]
        source_end = drain_without(source, work, rest)
        target_end = resume_s + drain(best, work)
        if source not in queued and not ledger.worth(source, source_end, best, target_end):
            refused[source] = ledger.top
            continue
        mine.remove(work)
        ledger.move(source, source_end, best, target_end)
        moves.append(Migration(name, source, best))
        slowest[best] = min(slowest[best], (work * here[source] - resume_s) / work)
        batch[source] -= 1
        tokens[source] -= work
        longest[source] = rest
        batch[best] += 1
        free[best] -= 1
        tokens[best] += work
        stall[best] += resume_s
        longest[best] = max(longest[best], work)
        here[source] = step_s(source, 0)
        there[best] = step_s(best, 1)
        ranked = open_targets()
    return moves


class _Ledger:
    """The step's predicted generation while the gain rule moves stragglers: each running actor's
    draining end (seconds from now); the step's end is the latest, its actor-seconds their sum,
    both counted from generation's start (`elapsed_s` ago)."""

    def __init__(self, ends: dict[int, float], lam: float, elapsed_s: float) -> None:
        self.ends, self.lam, self.elapsed = ends, lam, elapsed_s
        self.total = sum(ends.values())
        self.top = self._latest()

    def worth(self, source: int, source_end: float, target: int, target_end: float) -> bool:
        """Whether lam x the step's relative change in time + (1 - lam) x its relative change in
        actor-seconds falls with the move: the plan's score of N in relative form
        (`SchedulerConfig.normalise`), so a move that does not shorten the step must save
        actor-seconds."""
        now = self.top[0][1]
        others = next((e for a, e in self.top if a not in (source, target)), 0.0)
        d_time = max(others, source_end, target_end) - now
        d_cost = source_end - self.ends[source] + target_end - self.ends[target]
        time = self.elapsed + now
        cost = self.elapsed * len(self.ends) + self.total
        return self.lam * d_time / max(time, 1e-12) + (1.0 - self.lam) * d_cost / max(cost, 1e-12) < 0.0

    def move(self, source: int, source_end: float, target: int, target_end: float) -> None:
        self.total += source_end - self.ends[source] + target_end - self.ends[target]
        self.ends[source], self.ends[target] = source_end, target_end
        self.top = self._latest()

    def _latest(self) -> list[tuple[int, float]]:
        """The latest three ends, latest first (ties in the actors' order)."""
        return heapq.nlargest(3, self.ends.items(), key=lambda kv: kv[1])


def _gather_moves(
    sources: Sequence[ActorProgress], targets: Sequence[ActorProgress], profile: Profile, resume_s: float
) -> list[Migration]:
    """Empty cut actors so that they can be released: all of a cut actor's stragglers move, or
    none do, each to the running actor where it fits with the most slack, provided no receiver,
    and no migrant, is then predicted to end after the step's predicted end. Decoding a few more
    sequences costs a receiver little (its steps are bound by reading the weights), while the
    emptied actor stops being billed for the rest of the tail. Sources with the fewest stragglers
    go first. A gathered sequence may be gathered again later, since each gather releases an
    actor (so a sequence moves at most once per actor); within one call a receiver stays."""
    if not sources or not targets:
        return []
    actors = {p.actor: p for p in (*sources, *targets)}
    batch = {a: len(p.remaining) for a, p in actors.items()}
    longest = {a: max(p.remaining.values(), default=0.0) for a, p in actors.items()}
    arrivals = dict.fromkeys(actors, 0.0)  # the longest migrant each receiver got, tokens
    committed = dict(arrivals)  # ... in the moves decided so far (a failed trial is undone)
    free = {t.actor: t.free_slots for t in targets}

    def step_s(a: int, extra: int = 0) -> float:
        return profile.step_seconds(max(batch[a] + extra, 1), actors[a].context)

    def end_s(a: int, extra: int, work: float = 0.0) -> float:
        s = step_s(a, extra)
        return max(longest[a] * s, resume_s + max(arrivals[a], work) * s)

    step_end = max(longest[a] * step_s(a) for a in actors)
    emptied: set[int] = set()
    received: set[int] = set()
    moves = []
    for p in sorted(sources, key=lambda p: (len(p.remaining), p.actor)):
        if not p.remaining or p.actor in received:
            continue
        trial: list[tuple[str, int]] = []
        taken: dict[int, int] = {}
        for name, work in sorted(p.remaining.items(), key=lambda kv: -kv[1]):  # longest first
            best, best_slack = None, -1.0
            for a, room in free.items():
                if a == p.actor or a in emptied or room - taken.get(a, 0) <= 0:
                    continue
                # A target's earlier migrants of this source are no shorter than this one.
                slack = step_end - end_s(a, taken.get(a, 0) + 1, work)
                if slack >= 0 and slack > best_slack:
                    best, best_slack = a, slack
            if best is None:
                break
            trial.append((name, best))
            if best not in taken:
                arrivals[best] = max(arrivals[best], work)
            taken[best] = taken.get(best, 0) + 1
        if len(trial) < len(p.remaining):
            for a in taken:
                arrivals[a] = committed[a]
            continue
        moves.extend(Migration(name, p.actor, a) for name, a in trial)
        for a, k in taken.items():
            committed[a] = arrivals[a]
            batch[a] += k
            free[a] -= k
            received.add(a)
        batch[p.actor] = 0
        emptied.add(p.actor)
    return moves


def single_wave(progress: Sequence[ActorProgress]) -> bool:
    """Whether every running actor holds no more sequences than it decodes at once: then a
    step's time is bound by reading the weights, so a receiver decodes a few more sequences
    almost for free and `scheduler.migration=auto` gathers; with waves it weighs the gain."""
    return all(p.total <= p.free_slots + len(p.remaining) for p in progress if p.running)


def decide_migrations(
    progress: Sequence[ActorProgress],
    config: SchedulerConfig,
    profile: Profile | None = None,
    resume_s: float = 0.0,
    elapsed_s: float = 0.0,
) -> list[Migration]:
    """Per-actor cut at tau; targets are running actors not themselves cut (the gain rule: any
    running actor, so that stragglers gather on a drained one)."""
    cut = [p for p in progress if _is_cut(p, config.tau)]
    mode = config.migration
    if mode == "auto":
        mode = "gather" if single_wave(progress) else "gain"
    if profile is not None and mode == "gather":
        return _gather_moves(cut, [p for p in progress if p.running], profile, resume_s)
    if profile is not None and mode == "gain":  # a drained cut actor may gather
        running = [p for p in progress if p.running]
        return _gain_moves(cut, running, profile, resume_s, config.lam, elapsed_s)
    cut_ids = {p.actor for p in cut}
    return _move(cut, [p for p in progress if p.running and p.actor not in cut_ids])


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


def decide(
    progress: Sequence[ActorProgress],
    config: SchedulerConfig,
    profile: Profile | None = None,
    resume_s: float = 0.0,
    elapsed_s: float = 0.0,
) -> list[Migration]:
    """The configured policy's decision: per-actor cut, global cut, or none. `profile` (the
    actors' time table) turns on the gain test of the per-actor cut; `resume_s` is its estimate
    of the seconds a migrant waits to resume elsewhere; `elapsed_s`, how long generation has run
    (the gain test weighs a move against the whole generation; 0: against what is left of it,
    the stricter)."""
    cut = config.features["cut"]
    if cut == "actor":
        return decide_migrations(progress, config, profile, resume_s, elapsed_s)
    if cut == "global":
        return decide_global_cut(progress, config)
    return []
