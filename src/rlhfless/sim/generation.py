"""The generation phase of one simulated step: the planner's plan executed on the modelled cluster.

The prefill actor (on the learner's GPUs) computes the deduplicated prefixes; each decode actor
takes its GPUs over from the learner with the new weights on them (`Billing.handoff`), waits for
its prefix KV (the actor on the prefill actor's GPUs needs none), prefills what is left of its
prompts, then decodes with continuous batching (`execution.schedule`). Cut-and-migrate events
are found analytically from the schedules; at each one the planner's `migration.decide` is asked
what moves, and the receiving actors are rescheduled from that moment (migrated sequences are
resumed by re-prefilling prompt + partial response, or by receiving their KV when that is
cheaper).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from rlhfless.planner import admission
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.migration import ActorProgress, decide, remaining_tokens
from rlhfless.planner.step_plan import StepPlan
from rlhfless.sim.execution import Schedule, Siblings, schedule, slot_cap
from rlhfless.sim.stage import Stage
from rlhfless.sim.workload import StepPrompts

# The runtime asks the planner at every progress report; here each actor's cut points stand in for
# those: tau and three more, each halfway from the last to all (a later look sees the stragglers
# that are left, and may make a gather possible).
CHECKS = 4


class _Remaining(Mapping[str, float]):
    """Unfinished sequences of one actor -> remaining predicted tokens, backed by arrays.

    A sequence's id is its global index in the step (prompt * G + sample) as a string.
    """

    def __init__(self, idx: np.ndarray, work: np.ndarray) -> None:
        self._idx, self._work = idx, work

    def __len__(self) -> int:
        return int(self._idx.size)

    def __iter__(self) -> Iterator[str]:
        return map(str, self._idx.tolist())

    def __getitem__(self, key: str) -> float:
        return dict(zip(self, self._work.tolist(), strict=True))[key]

    def values(self) -> list[float]:  # type: ignore[override]
        return self._work.tolist()

    def items(self) -> Iterator[tuple[str, float]]:  # type: ignore[override]
        return zip(self, self._work.tolist(), strict=True)


@dataclass
class ActorRun:
    """One decode actor's life in this step; `sched` holds only what is unfinished since `since`."""

    gpus: int
    node: int
    colocated: bool
    ready: float  # every function starts at 0, on GPUs the learner handed over (`Billing.handoff`)
    decoding: float  # when it starts decoding: its KV received and its own prompts' part prefilled
    slots: int
    sched: Schedule
    finished_before: int = 0
    released: float = math.inf
    cut_checks: int = 0  # decisions made at its cut points so far
    migrated_in: int = 0
    migrated_out: int = 0

    @property
    def total(self) -> int:
        return self.finished_before + int(self.sched.ids.size)

    def finished_at(self, t: float) -> int:
        return self.finished_before + int(np.count_nonzero(self.sched.end <= self.sched.step_at(t) + 1e-9))


class Generation:
    """The generation phase of one step: actors, their schedules, and the cut events."""

    def __init__(
        self,
        stage: Stage,
        config: SchedulerConfig,
        prompts: StepPrompts,
        plan: StepPlan,
        serverful: bool,
    ) -> None:
        self.stage, self.config, self.plan = stage, config, plan
        g = self.group_size = prompts.lengths.shape[1]
        plen = prompts.prompt_lengths
        self.prompt_len = np.repeat(plen, g).astype(float)
        self.true = prompts.lengths.ravel().astype(float)
        gmax = np.array([plan.predicted_length[u] for u in prompts.uids], dtype=float)
        self.predicted = np.repeat(gmax, g)
        self.gen_before = np.zeros(self.true.size)
        self.moved = np.zeros(self.true.size, dtype=bool)  # migrated once: never again
        self.finish = np.full(self.true.size, np.nan)  # when each sequence finished (s)
        self.migrations = 0
        profile = stage.profile
        dedup = bool(plan.features.get("dedup_prefill"))
        prefix = plan.prefix_tokens(prompts.uids, plen)  # KV each prompt receives (tree or paper)
        self.prefill_s = float(profile.prefill_seconds(plan.prefill["tokens"])) if dedup else 0.0
        index = {u: i for i, u in enumerate(prompts.uids)}
        cluster = stage.cluster
        self.runs: list[ActorRun] = []
        for actor in plan.actors:
            p = np.fromiter((index[u] for u in actor.uids), dtype=np.int64, count=len(actor.uids))
            seqs = (p[:, None] * g + np.arange(g)).ravel()
            colocated = bool(actor.gpu_ids) and actor.gpu_ids[0] == 0
            near = actor.node == 0  # the learner's node
            if serverful:
                ready = 0.0
            elif colocated:
                ready = self.prefill_s
            else:  # on GPUs the learner handed over, the new weights on them: only the KV streams
                kv_bytes = stage.model.kv_bytes_per_token * float(prefix[p].sum())
                ready = self.prefill_s + float(cluster.transfer_seconds(kv_bytes, near, actor.gpus))
            t0 = ready + float(profile.prefill_seconds(actor.prefill_tokens))
            sib = None
            if plan.features.get("probe_admission"):  # the plan's order, one sample a prompt first
                seqs = seqs[admission.initial_order(np.arange(seqs.size, 0, -1.0), seqs // g, True)]
                sib = Siblings(seqs // g, self.predicted[seqs], np.zeros(seqs.size))
            context, remaining = self.prompt_len[seqs], self.true[seqs]
            cap = slot_cap(profile, context, remaining)
            sched = schedule(profile, t0, seqs, context, remaining, cap, siblings=sib)
            slots = min(cap, seqs.size)
            self.runs.append(ActorRun(actor.gpus, actor.node, colocated, ready, t0, slots, sched))

    def run(self) -> None:
        mode = self.plan.cut
        fired_global = False
        while mode in ("actor", "global"):
            if mode == "actor":
                t = self._next_actor_cut()
            else:
                t = math.inf if fired_global else self._global_cut()
                fired_global = True
            if not math.isfinite(t):
                break
            progress = self._progress(t)
            moves = decide(progress, self.config, self.stage.profile, self._resume_estimate(progress), t)
            if mode == "actor":
                for run in self.runs:
                    if run.cut_checks < CHECKS and self._cut_time(run) <= t + 1e-12:
                        run.cut_checks += 1
            if moves:
                self._apply(moves, t)
        for run in self.runs:
            if not math.isfinite(run.released):
                run.released = run.sched.end_time
            self.finish[run.sched.ids] = run.sched.finish

    def _alive(self, run: ActorRun) -> bool:
        return not math.isfinite(run.released) and run.sched.ids.size > 0

    def _cut_time(self, run: ActorRun) -> float:
        """When this actor's finished share reaches its next cut point with work left (inf: never):
        tau, then halfway from there to all."""
        share = 1.0 - (1.0 - self.config.tau) / 2**run.cut_checks
        need = math.ceil(share * run.total - 1e-9) - run.finished_before
        n = run.sched.ids.size
        if need >= n:
            return math.inf
        if need <= 0:
            return run.sched.t0
        return float(
            np.interp(
                np.partition(run.sched.end, need - 1)[need - 1], run.sched.grid_steps, run.sched.grid_time
            )
        )

    def _next_actor_cut(self) -> float:
        times = [self._cut_time(r) for r in self.runs if self._alive(r) and r.cut_checks < CHECKS]
        return min(times, default=math.inf)

    def _global_cut(self) -> float:
        total = sum(r.total for r in self.runs)
        need = math.ceil(self.config.tau * total - 1e-9) - sum(r.finished_before for r in self.runs)
        finish = np.concatenate([r.sched.finish for r in self.runs])
        if need >= finish.size:
            return math.inf
        return float(np.partition(finish, max(need, 1) - 1)[max(need, 1) - 1])

    def _progress(self, t: float) -> list[ActorProgress]:
        out = []
        for i, run in enumerate(self.runs):
            s = run.sched
            if not self._alive(run) or s.end_time <= t:  # drained: released, as the runtime does
                out.append(ActorProgress(i, run.total, run.total, 0, False, {}))
                continue
            step = s.step_at(t)
            unfinished = s.end > step + 1e-9
            idx = s.ids[unfinished]
            generated = self.gen_before[idx] + np.clip(step - s.start[unfinished], 0, s.remaining[unfinished])
            work = remaining_tokens(
                self.predicted[idx], generated, self.stage.max_response, self.plan.overrun
            )
            free = max(0, run.slots - idx.size)  # queued sequences and migrants in flight hold slots
            context = float(np.mean(self.prompt_len[idx] + generated)) if idx.size else 0.0
            moved = frozenset(map(str, idx[self.moved[idx]].tolist()))
            remaining = _Remaining(idx, work)
            out.append(
                ActorProgress(
                    i, run.total - idx.size, run.total, free, True, remaining, context, moved, run.slots
                )
            )
        return out

    def _resume_estimate(self, progress: list[ActorProgress]) -> float:
        """What the planner is told a migrant waits: its KV sent across nodes or re-prefilled,
        whichever is sooner, at the running sequences' mean context."""
        contexts = [p.context for p in progress if p.remaining]
        if not contexts:
            return 0.0
        tokens = float(np.mean(contexts))
        st = self.stage
        send = float(
            st.cluster.transfer_seconds(st.model.kv_bytes_per_token * tokens, False, st.profile.gpus)
        )
        return min(send, float(st.profile.prefill_seconds(tokens)))

    def _apply(self, moves: list, t: float) -> None:
        leaving: dict[int, list[int]] = {}
        arriving: dict[int, list[int]] = {}
        sources: dict[int, set[int]] = {}
        for m in moves:
            seq = int(m.sequence)
            self.moved[seq] = True
            leaving.setdefault(m.source, []).append(seq)
            arriving.setdefault(m.target, []).append(seq)
            sources.setdefault(m.target, set()).add(m.source)
        self.migrations += len(moves)
        affected = sorted(set(leaving) | set(arriving))
        # Freeze every affected actor at t first: a migrant's progress must be known before it lands.
        held = {i: self._freeze(i, t) for i in affected}
        resume: dict[int, tuple[float, float]] = {}
        sending_until: dict[int, float] = {}
        for target, seqs in arriving.items():
            resume[target] = self._resume(target, np.array(seqs, dtype=np.int64), sources[target])
            for source in sources[target]:  # a sender lives until its KV has left
                sending_until[source] = max(sending_until.get(source, t), t + resume[target][1])
        for i in affected:
            out = np.array(leaving.get(i, []), dtype=np.int64)
            incoming = np.array(arriving.get(i, []), dtype=np.int64)
            self._restart(i, t, held[i], out, incoming, resume.get(i, (0.0, 0.0)))
            run = self.runs[i]
            if math.isfinite(run.released):
                run.released = max(run.released, sending_until.get(i, t))

    def _resume(self, target: int, incoming: np.ndarray, sources: set[int]) -> tuple[float, float]:
        """(receiver stall, migrant KV transfer) seconds: re-prefill prompt + partial response on
        the receiver (stalls it), or send the KV (only the migrants wait), whichever is sooner."""
        tokens = float((self.prompt_len[incoming] + self.gen_before[incoming]).sum())
        run = self.runs[target]
        same_node = all(self.runs[s].node == run.node for s in sources)
        kv_bytes = self.stage.model.kv_bytes_per_token * tokens
        transfer = float(self.stage.cluster.transfer_seconds(kv_bytes, same_node, run.gpus))
        prefill = float(self.stage.profile.prefill_seconds(tokens))
        return (0.0, transfer) if transfer <= prefill else (prefill, 0.0)

    def _freeze(self, i: int, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Book actor i's progress up to t; return its unfinished ids, running ones first."""
        run = self.runs[i]
        s = run.sched
        step = s.step_at(t)
        unfinished = s.end > step + 1e-9
        run.finished_before += int(np.count_nonzero(~unfinished))
        self.finish[s.ids[~unfinished]] = s.finish[~unfinished]
        generated = np.clip(step - s.start, 0, s.remaining)
        self.gen_before[s.ids[unfinished]] += generated[unfinished]
        started = s.start <= step + 1e-9
        return s.ids[unfinished & started], s.ids[unfinished & ~started]

    def _restart(
        self,
        i: int,
        t: float,
        held: tuple[np.ndarray, np.ndarray],
        out: np.ndarray,
        incoming: np.ndarray,
        resume: tuple[float, float],
    ) -> None:
        """Actor i's new schedule from t: its running sequences, then migrants, then its queue."""
        run = self.runs[i]
        profile = self.stage.profile
        running, waiting = (ids[~np.isin(ids, out)] for ids in held)
        ids = np.concatenate([running, incoming, waiting])
        run.migrated_out += int(out.size)
        run.migrated_in += int(incoming.size)
        if ids.size == 0:
            run.released = t
            run.sched = schedule(profile, t, ids, ids.astype(float), ids.astype(float), run.sched.cap)
            return
        context = self.prompt_len[ids] + self.gen_before[ids]
        remaining = self.true[ids] - self.gen_before[ids]
        stall, transfer = resume
        ready = None
        if transfer > 0:
            # The receiver keeps decoding its own sequences; migrants join once their KV arrived.
            own = np.r_[np.arange(running.size), np.arange(running.size + incoming.size, ids.size)]
            base = schedule(profile, t, ids[own], context[own], remaining[own], run.sched.cap)
            ready = np.zeros(ids.size)
            ready[running.size : running.size + incoming.size] = base.step_after(profile, t + transfer)
        run.sched = schedule(profile, t + stall, ids, context, remaining, run.sched.cap, ready)
