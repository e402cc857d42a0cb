"""One step's generation on decode functions: assign, advance, cut, migrate, recover.

A `DecodeRound` lives for one `generate` call and owns all of its state. It leases one function per
plan actor on the plan's node, assigns each its prompts (prefix KV from the step's bundle), then
drives them in time slices: after every progress report the planner's cut-and-migrate rule
decides, and sequence states move between functions. A function that dies (or whose node does)
has its unfinished sequences re-run elsewhere from their last reported state; one not placed within
`runtime.place_timeout_s` is stopped and its sequences are placed again the same way. Sampling is
counter-based, so none of this changes a token. Finished sequences go to the step's `Preparation`,
and a function done while others still decode offers it its slot (preparation overlapped with the
tail).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import ray

from rlhfless.config import Config
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import SequenceResult
from rlhfless.faults import DecodeFault
from rlhfless.planner.learning import generation_left_s
from rlhfless.planner.migration import ActorProgress, decide, remaining_tokens
from rlhfless.planner.step_plan import StepPlan
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.functions import LiveSequence, Report, Work
from rlhfless.runtime.lifecycle import LOST, Functions
from rlhfless.runtime.pool import Lease
from rlhfless.runtime.preparation import Preparation
from rlhfless.runtime.publishing import PrefixKV
from rlhfless.runtime.ray_cluster import ClusterView
from rlhfless.runtime.recovery import Recovery
from rlhfless.runtime.samples import StepPrompt
from rlhfless.runtime.transfer import Transfer

Key = tuple[str, int]  # (uid, sample index)
METRICS = (
    "time/weight_sync",
    "bytes/weight_sync",
    "time/kv_transfer",
    "bytes/kv_transfer",
    "migrations",
    "faults",
    "faults/unplaced",
    "faults/rerun_sequences",
    "faults/resumed_tokens",
    "faults/injected",
    "time/prefill",
    "time/decode",
    "prefill/tokens_computed",
)


@dataclass(eq=False)
class Run:
    """One decode function's part of this step."""

    index: int
    lease: Lease
    inv: Invocation
    colocated: bool
    node: str
    assigned: set[Key] = field(default_factory=set)
    finished: set[Key] = field(default_factory=set)
    free_slots: int = 0
    incoming: int = 0  # sequences sent after its in-flight slice began: not in that slice's report
    placed: bool = False  # Ray gave it a worker on its node (a report came back, or Ray says so)
    done: bool = False
    keep_warm: bool = False  # at release: back to the pool warm (the plan's choice), else stopped
    sync: object = None  # ObjectRef of the weight load, when one was needed
    sync_sent: float = 0.0
    assign: object = None  # ObjectRef of the assignment (its prefix KV load)
    kv_bytes: int = 0
    iterations: int = 0  # decode iterations it reported so far this step
    migrated_in: set[Key] = field(default_factory=set)  # moved here this step: never moved again
    token_s: float | None = None  # seconds per decode iteration, as its last slice measured
    faults: list[DecodeFault] = field(default_factory=list)  # injected (runtime.faults), not fired yet

    @property
    def name(self) -> str:
        return self.inv.name

    def pending(self) -> set[Key]:
        return self.assigned - self.finished


class DecodeRound(Recovery):
    """The controller of one step's generation (its fault recovery: `Recovery`); see the module
    docstring."""

    def __init__(
        self,
        cfg: Config,
        functions: Functions,
        meter: Meter,
        view: ClusterView,
        prompts: list[StepPrompt],
        plan: StepPlan,
        step: int,
        params: SamplingParams,
        preparation: Preparation | None,
        group: int | None = None,
    ) -> None:
        """`preparation` is fed every finished sequence, and the slots of functions done while
        others still decode (`Preparation.offer`); None: a validation's round, whose responses
        the caller scores. `group`: sequences per prompt (default: the algorithm's group size)."""
        self.cfg, self.functions, self.meter, self.view = cfg, functions, meter, view
        self.preparation = preparation
        self.rt = cfg.runtime
        self.prompts = {p.uid: p for p in prompts}
        self.plan, self.step, self.params = plan, step, params
        self.group = group or cfg.algorithm.group_size
        self.serverful = cfg.scheduler.policy == "verl"
        self.runs: list[Run] = []
        self.held: list[Lease] = []  # verl: held to the end of the step
        self.last: dict[Key, LiveSequence] = {}
        self.results: dict[Key, SequenceResult] = {}
        self.inflight: dict[ray.ObjectRef, Run] = {}
        self.metrics: dict[str, float] = dict.fromkeys(METRICS, 0.0)
        self.weights: tuple[ray.ObjectRef, int, int] | None = None  # (ref, bytes, version)
        self.opened = time.time()  # generation's start (`lease`), for the gain rule's weighing

    # ----- leasing -------------------------------------------------------------------------

    def lease(self, weights: tuple[ray.ObjectRef, int, int]) -> None:
        """One function per plan actor, on its node (the learner's host actor colocated), each
        loading the weights of this version unless it holds them."""
        self.weights = weights
        self.opened = time.time()
        host = next((a.actor for a in self.plan.actors if a.node == 0 and a.gpu_ids[:1] == [0]), None)
        for a in self.plan.actors:
            colocated = a.actor == host
            node = self.view.node_id(a.node % len(self.view.nodes))
            run = self._open(a.actor, f"decode-{a.actor}", colocated, node, float(a.gpus))
            run.keep_warm = colocated or a.keep_warm
            run.free_slots = max(0, self.cfg.generation.max_running - self.group * len(a.uids))

    def _open(self, index: int, name: str, colocated: bool, node: str, units: float) -> Run:
        now = time.time()
        lease, inv = self.functions.acquire(self.meter, name, "decode", colocated, node, units, now)
        run = Run(index, lease, inv, colocated, lease.shape[2])
        ref, _, version = self.weights
        if lease.version != version:
            lease.version = version
            run.sync, run.sync_sent = lease.handle.sync.remote(ref, version), now
        self.runs.append(run)
        if self.serverful:
            self.held.append(lease)
        return run

    # ----- assign and advance --------------------------------------------------------------

    def assign(self, kv: PrefixKV | None) -> None:
        """Queue each function's prompts (their prefix KV views the bundle) and start its first slice."""
        node_of = {self.view.node_id(i % len(self.view.nodes)): i for i in range(len(self.view.nodes))}
        armed = self.rt.fault_plan.decode(
            self.step,
            [(a.actor, a.node, run.colocated) for run, a in zip(self.runs, self.plan.actors, strict=True)],
            node_of.get(self.view.driver),
        )
        for run, a in zip(self.runs, self.plan.actors, strict=True):
            work: list[Work] = []
            for uid in a.uids:
                ids = self.prompts[uid].prompt_ids
                if kv is not None:
                    work.append((uid, ids, list(range(self.group)), kv.index_of.get(uid)))
                else:  # no dedup: every sample prefills its whole prompt
                    work.extend((uid, ids, [s], None) for s in range(self.group))
            run.assigned = {(uid, s) for uid in a.uids for s in range(self.group)}
            if kv is not None:
                run.kv_bytes = kv.nbytes(a.uids)
                if not run.colocated:
                    self.metrics["bytes/kv_transfer"] += run.kv_bytes
            run.faults = armed.get(a.actor, [])
            handle = run.lease.handle
            run.assign = handle.assign.remote(
                work, None if kv is None else kv.ref, self.params, self.step, run.faults
            )
            self._advance(run)

    def _advance(self, run: Run) -> None:
        self.inflight[run.lease.handle.advance.remote(self.rt.slice_s)] = run

    def run(self, tick: Callable[[DecodeRound], None] | None = None) -> dict[Key, SequenceResult]:
        """Drive the functions slice by slice until every sequence finished; cut, migrate, recover.
        `tick` sees the round after each report (the executor starts the learning phase's ranks
        from it)."""
        while self.inflight:
            if tick is not None:
                tick(self)
            waiting = [*self.inflight, *(self.preparation.refs() if self.preparation is not None else ())]
            ready, _ = ray.wait(waiting, num_returns=1, timeout=self._placement_wait())
            if not ready:
                self._replace_unplaced()
                continue
            if ready[0] not in self.inflight:  # a preparation call, overlapped with the tail
                self.preparation.absorb(ready[0])
                self._feed()
                continue
            run = self.inflight.pop(ready[0])
            try:
                report: Report = ray.get(ready[0])
            except LOST:
                self._lost(run)
                continue
            self._absorb(run, report)
            if run.pending():
                self._cut(run)
            if run.done:
                continue
            if run.pending():
                self._advance(run)
            else:
                self._finished(run)
            self._feed()
        return self.results

    def _feed(self) -> None:
        """While some functions still decode: ready groups to idle preparers (the learner's slot
        is free once no decode function runs on it)."""
        decoding = [r for r in self.runs if not r.done]
        if decoding and self.preparation is not None:
            self.preparation.feed(learner_free=not any(r.colocated for r in decoding))

    def _absorb(self, run: Run, report: Report) -> None:
        # A cold start is over once it reports: its times now stand in for a rank start not yet
        # measured (`Meter.cold_start_s`).
        self.functions.settle(run.lease, run.inv)
        run.inv.mark_busy(report.begin, report.end)
        run.placed = True
        if report.iterations > run.iterations:
            run.token_s = (report.end - report.begin) / (report.iterations - run.iterations)
            run.iterations = report.iterations
        for kind in report.fired:  # injected faults it survived (a slow-down)
            run.inv.event(report.end, f"injected:{kind}", 1)
            run.faults = [f for f in run.faults if f.kind != kind or f.after > report.iterations]
            self.metrics["faults/injected"] += 1
        for r in report.results:
            key = (r.uid, r.sample)
            self.results[key] = r
            run.finished.add(key)
            self.last.pop(key, None)
        if self.preparation is not None:
            self.preparation.add(report.results)
        for live in report.live:
            self.last[(live.uid, live.sample)] = live
        # Sequences migrated in while that slice ran arrive after it: they take slots the report
        # still counts as free.
        run.free_slots, run.incoming = report.free_slots - run.incoming, 0
        self.metrics["time/prefill"] += report.stats.prefill_seconds
        self.metrics["time/decode"] += report.stats.decode_seconds
        self.metrics["prefill/tokens_computed"] += report.stats.prompt_tokens_computed

    def _progress(self) -> list[ActorProgress]:
        predicted, cap = self.plan.predicted_length, self.cfg.generation.max_new_tokens

        def remaining(pending: set[Key]) -> dict[str, float]:
            """Each pending sequence's predicted rest, in one call over the run's sequences."""
            keys = sorted(pending)
            done = [len(self.last[k].generated) if k in self.last else 0 for k in keys]
            wanted = [predicted.get(uid, 1.0) for uid, _ in keys]
            left = remaining_tokens(
                np.array(wanted, dtype=float), np.array(done, dtype=float), cap, self.plan.overrun
            )
            return {f"{uid}#{s}": x for (uid, s), x in zip(keys, left.tolist(), strict=True)}

        def context(keys: set[Key]) -> float:
            """Mean KV tokens of these running sequences: prompt and generated so far."""
            if not keys:
                return 0.0
            done = sum(len(self.last[k].generated) for k in keys if k in self.last)
            return (sum(len(self.prompts[uid].prompt_ids) for uid, _ in keys) + done) / len(keys)

        return [
            ActorProgress(
                run.index,
                len(run.finished),
                len(run.assigned),
                run.free_slots,
                not run.done,
                remaining(run.pending()),
                context(run.pending()),
                frozenset(f"{uid}#{s}" for uid, s in run.migrated_in),
                self.cfg.generation.max_running,
            )
            for run in self.runs
        ]

    def _resume_s(self, progress: list[ActorProgress]) -> float:
        """What a migrant is estimated to wait before it decodes again: its re-prefill at the running
        sequences' mean context, unless its KV travels with it (`runtime.migrate_kv`)."""
        contexts = [p.context for p in progress if p.remaining]
        if self.rt.migrate_kv or self.plan.profile is None or not contexts:
            return 0.0
        return float(self.plan.profile.prefill_seconds(sum(contexts) / len(contexts)))

    def left_s(self) -> float | None:
        """Seconds until generation is forecast to end, from the functions' last reports
        (`planner.learning.generation_left_s`)."""
        token_s = {run.index: run.token_s for run in self.runs if run.token_s is not None}
        return generation_left_s(self._progress(), token_s)

    # ----- cut and migrate -----------------------------------------------------------------

    def _cut(self, source: Run) -> None:
        """Cut `source`'s sequences the planner's rule names and resume each on its target."""
        progress = self._progress()  # the simulator's decision: the plan's profile, the gain test
        elapsed = time.time() - self.opened
        decided = decide(progress, self.cfg.scheduler, self.plan.profile, self._resume_s(progress), elapsed)
        moves = [m for m in decided if m.source == source.index]
        if not moves:
            return
        by_index = {run.index: run for run in self.runs}
        groups: dict[int, list[Key]] = {}
        for m in moves:
            uid, sample = m.sequence.rsplit("#", 1)
            groups.setdefault(m.target, []).append((uid, int(sample)))
        targets = list(groups)
        start = time.time()
        refs = source.lease.handle.cut.options(num_returns=len(targets) + 1).remote(
            [groups[t] for t in targets], self.rt.migrate_kv
        )
        try:
            moved: list[int] = ray.get(refs[-1])["bytes"]
        except LOST:  # the source died while cutting: its sequences re-run from their last report
            self._lost(source)
            return
        now = time.time()
        n = sum(len(keys) for keys in groups.values())
        source.inv.event(now, "cut", n)
        source.inv.event(now, "migrate_out", n)
        for target_index, states_ref, nbytes in zip(targets, refs[:-1], moved, strict=True):
            target, keys = by_index[target_index], groups[target_index]
            target.lease.handle.resume.remote(states_ref, self.params, self.step)
            self._moved_in(target, keys, now)
            source.assigned -= set(keys)
            self.meter.transfer(
                Transfer(
                    "migration",
                    source.name,
                    target.name,
                    nbytes,
                    now - start,
                    source.node == target.node,
                    start,
                )
            )
        self.metrics["migrations"] += n
        self.metrics["bytes/kv_transfer"] += sum(moved)
        self.metrics["time/kv_transfer"] += now - start

    def _moved_in(self, target: Run, keys: list[Key], now: float) -> None:
        target.assigned |= set(keys)
        target.migrated_in |= set(keys)
        target.free_slots -= len(keys)
        target.incoming += len(keys)
        target.inv.event(now, "migrate_in", len(keys))

    # ----- release and settle --------------------------------------------------------------

    def _finished(self, run: Run) -> None:
        """Every sequence of `run` finished: release it now (serverless), after it prepared ready
        groups when others still decode, or keep holding it (verl)."""
        run.done = True
        if not self.serverful:
            now = time.time()
            run.inv.released = now
            if self.preparation is not None and not run.colocated and any(not r.done for r in self.runs):
                self.preparation.offer(run.lease, run.inv, run.keep_warm)
            else:
                self.functions.release(run.lease, now, keep=run.keep_warm)

    def settle(self, kv: PrefixKV | None) -> None:
        """Cold-start times, nodes, and weight/KV load seconds, read once the functions are done."""
        sync_seconds, assign_seconds = [0.0], [0.0]
        _, nbytes, _ = self.weights
        driver = self.view.driver
        for run in self.runs:
            self.functions.settle(run.lease, run.inv)
            same = run.inv.node == driver
            if run.sync is not None:
                seconds = _seconds(run.sync)
                sync_seconds.append(seconds)
                if not run.colocated:
                    self.metrics["bytes/weight_sync"] += nbytes
                self.meter.transfer(
                    Transfer("weights", "learner", run.name, nbytes, seconds, same, run.sync_sent)
                )
            if run.assign is not None:
                seconds = _seconds(run.assign)
                assign_seconds.append(seconds)
                if kv is not None:
                    self.meter.transfer(
                        Transfer("kv", "prefill", run.name, run.kv_bytes, seconds, same, kv.put)
                    )
        self.metrics["time/weight_sync"] = max(sync_seconds)
        self.metrics["time/kv_transfer"] += max(assign_seconds)


def _seconds(ref: ray.ObjectRef) -> float:
    """What a load call reported it took (0 when its function died)."""
    try:
        return float(ray.get(ref) or 0.0)
    except LOST:
        return 0.0
