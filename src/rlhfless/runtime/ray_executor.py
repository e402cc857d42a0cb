"""The serverless executor: each step's plan runs as short-lived functions on Ray, metered.

The learner lives in this (driver) process for the whole run and is also the prefill function:
it computes the step's unique prefix KV on the current weights, with no sync. Decode functions
are leased from a warm pool per step as the plan says, get the new weights as one flat buffer put
once per version, and the prefix KV as one bundle put once per step. They decode in time slices;
after every slice the planner's cut-and-migrate rule decides, and the controller moves sequence
states between functions. A function that dies has its unfinished sequences re-run elsewhere from
their last reported state. Sampling is counter-based, so none of this changes a token.

Billing (the one pricing model, through the meter): the learner's resources for the whole step
under every policy; the prefill function, the decode function the plan colocates with the learner,
and the reference/reward function share them and are billed once. Other decode functions are
billed while leased, then while warm in the pool; at release each is kept warm or stopped as the
plan says. Under `verl` they are held for the whole step, as a serverful deployment would.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import ray
import torch
from ray.exceptions import OutOfMemoryError, RayActorError, WorkerCrashedError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from torch import Tensor

from rlhfless.config import Config
from rlhfless.engine.sequences import SequenceResult, SequenceState
from rlhfless.planner.migration import ActorProgress, Migration, decide
from rlhfless.planner.plan import StepPlan
from rlhfless.rewards import RewardFn
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.executor import LocalLearner
from rlhfless.runtime.functions import DecodeFunction, LiveSequence, PrepareFunction, Report, Work
from rlhfless.runtime.pool import FunctionPool, Lease, Shape
from rlhfless.runtime.samples import Sample, StepPrompt, canonical
from rlhfless.runtime.transfer import KVBundle, flat_weights
from rlhfless.runtime_config import RuntimeConfig

Key = tuple[str, int]  # (uid, sample index)
LOST = (RayActorError, OutOfMemoryError, WorkerCrashedError)  # the function's process is gone


def start_ray(rt: RuntimeConfig) -> bool:
    """Connect to `rt.ray_address`, or start an embedded Ray on 127.0.0.1; True if we started it.

    The embedded instance offers this machine's cores minus the learner's slot (the driver
    process), so decode functions never oversubscribe the CPUs.
    """
    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    if rt.ray_address:
        ray.init(address=rt.ray_address, **quiet)
        return True
    cores = rt.num_cpus or os.cpu_count() or 1
    ray.init(
        address="local",
        num_cpus=max(1, cores - rt.cpus_per_actor),
        include_dashboard=rt.dashboard,
        _node_ip_address="127.0.0.1",
        **quiet,
    )
    return True


@dataclass(eq=False)
class Run:
    """One decode function's part of this step."""

    index: int
    lease: Lease
    inv: Invocation
    colocated: bool
    assigned: set[Key] = field(default_factory=set)
    finished: set[Key] = field(default_factory=set)
    free_slots: int = 0
    done: bool = False
    sync: object = None  # ObjectRef of the weight load, when one was needed
    keep_warm: bool = False  # at release: back to the pool warm (the plan's choice), else stopped

    def pending(self) -> set[Key]:
        return self.assigned - self.finished


class RayExecutor(LocalLearner):
    """Executes step plans on Ray functions; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None,
        tokenizer,
        reward_fn: RewardFn,
    ) -> None:
        super().__init__(cfg, policy, reference, tokenizer, reward_fn)  # learner + prefill engine
        self.rt = cfg.runtime
        self.owns_ray = start_ray(self.rt)
        self.gpu = ray.cluster_resources().get("GPU", 0) > 0
        self.driver_node = ray.get_runtime_context().get_node_id()
        others = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != self.driver_node)
        self.nodes = [self.driver_node, *others]
        self.serverful = cfg.scheduler.policy == "verl"
        self.meter = Meter(cfg.scheduler.pricing)
        self.pool = FunctionPool(self._create, float("inf") if self.serverful else self.rt.keep_alive_s)
        self.weights: tuple[int, ray.ObjectRef, int] | None = None  # (version, ref, bytes)
        self.reference_ref = None if reference is None else ray.put(flat_weights(reference))
        self.slot = (
            {"GPU": float(cfg.scheduler.gpus_per_actor)}
            if self.gpu
            else {"CPU": float(self.rt.cpus_per_actor)}
        )
        if not self.gpu and not cfg.trainer.threads:
            # The learner holds one CPU slot like every function: more threads would use cores
            # that nobody is billed for (and that a decode function of the same step is using).
            torch.set_num_threads(self.rt.threads_per_actor)
        self.held: list[Lease] = []
        self.metrics: dict[str, float] = {}
        self.learner_inv: Invocation | None = None

    # ----- functions -----------------------------------------------------------------------

    def _create(self, shape: Shape):
        kind, colocated, node = shape
        node_id = self.driver_node if colocated else self.nodes[node % len(self.nodes)]
        options: dict = {
            "max_restarts": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=not colocated),
        }
        if colocated:  # runs on the learner's resources, which the driver holds
            options.update(num_cpus=0, num_gpus=0)
        elif self.gpu:
            options.update(num_cpus=0, num_gpus=self.cfg.scheduler.gpus_per_actor)
        else:
            options.update(num_cpus=self.rt.cpus_per_actor)
        cfg, vocab = self.cfg, len(self.tokenizer)
        if kind == "decode":
            device = "cuda" if self.gpu and not colocated else "cpu"
            return (
                ray.remote(DecodeFunction)
                .options(**options)
                .remote(
                    cfg.model,
                    vocab,
                    cfg.seed,
                    [self.tokenizer.eos_token_id],
                    self.tokenizer.pad_token_id,
                    cfg.generation.max_running,
                    self.rt.threads_per_actor,
                    device,
                )
            )
        return (
            ray.remote(PrepareFunction)
            .options(**options)
            .remote(
                None if self.reference is None else cfg.model,
                vocab,
                cfg.seed,
                cfg.reward,
                cfg.trainer.micro_batch_tokens,
                cfg.generation.temperature,
                self.tokenizer.pad_token_id,
                self.rt.threads_per_actor,
            )
        )

    def _open(
        self, name: str, kind: str, lease: Lease, units: float, colocated: bool, now: float
    ) -> Invocation:
        """An invocation record; warm leases start at once, cold ones when their process does."""
        inv = Invocation(
            name,
            kind,
            dict(self.slot) if colocated or not self.gpu else {"GPU": units},
            units,
            requested=now,
            started=None if lease.cold else now,
            colocated_with="learner" if colocated else None,
            cold=lease.cold,
        )
        return self.meter.open(inv)

    def _on_learner(self, kind: str, start: float, done: float, end: float) -> None:
        """Record a function that ran inside the learner (busy until `done`, alive until `end`):
        on its resources, billed through it."""
        inv = self.meter.open(
            Invocation(kind, kind, dict(self.slot), 0.0, start, start, start, colocated_with="learner")
        )
        inv.mark_busy(start, done)
        inv.released = end
        self.learner_inv.mark_busy(start, end)

    def _settle(self, lease: Lease, inv: Invocation) -> None:
        """Fill a cold start's started/ready times from the function's own clock."""
        if lease.hello is None:
            return
        try:
            hello = ray.get(lease.hello)
            # A pre-started worker process is older than the request: billing starts at the request.
            inv.started, inv.ready = max(inv.requested, hello.started), hello.ready
        except LOST:
            inv.started = inv.started or inv.requested
        lease.hello = None

    def _publish(self) -> tuple[ray.ObjectRef, int]:
        """The current weights in the object store: one flat buffer, put once per version."""
        if self.weights is None or self.weights[0] != self.version:
            start = time.time()
            flat = flat_weights(self.policy)
            self.weights = (self.version, ray.put(flat), int(flat.nbytes))
            self.learner_inv.mark_busy(start, time.time())
            self.metrics["time/weight_put"] = time.time() - start
        return self.weights[1], self.weights[2]

    def _sync(self, lease: Lease, colocated: bool) -> object:
        if lease.version == self.version:
            return None
        ref, nbytes = self._publish()
        lease.version = self.version
        if not colocated:
            self.metrics["bytes/weight_sync"] += nbytes
        return lease.handle.sync.remote(ref, self.version)

    # ----- generation ----------------------------------------------------------------------

    def generate(self, prompts: list[StepPrompt], plan: StepPlan, step: int) -> tuple[list[Sample], dict]:
        now = time.time()
        self.meter.begin_step(now)
        self.metrics = {
            key: 0.0
            for key in (
                "time/weight_put",
                "time/weight_sync",
                "bytes/weight_sync",
                "time/kv_transfer",
                "bytes/kv_transfer",
                "migrations",
                "faults",
                "faults/rerun_sequences",
                "faults/resumed_tokens",
                "time/prefill",
                "time/decode",
                "prefill/tokens_computed",
            )
        }
        self.learner_inv = self.meter.open(
            Invocation(
                "learner", "learner", dict(self.slot), float(self.cfg.scheduler.gpus_per_actor), now, now, now
            )
        )
        self.prompt_ids = {p.uid: p.prompt_ids for p in prompts}
        self.predicted = plan.predicted_length
        group = self.cfg.algorithm.group_size
        self.policy.eval()

        host = next((a.actor for a in plan.actors if a.node == 0 and a.gpu_ids[:1] == [0]), None)
        runs = []
        for a in plan.actors:
            colocated = a.actor == host
            lease = self.pool.acquire(("decode", colocated, a.node), time.time())
            inv = self._open(f"decode-{a.actor}", "decode", lease, float(a.gpus), colocated, now)
            lease.units, lease.resources = (0.0 if colocated else inv.units), inv.resources
            run = Run(a.actor, lease, inv, colocated, sync=self._sync(lease, colocated))
            run.keep_warm = colocated or a.keep_warm
            run.free_slots = max(0, self.cfg.generation.max_running - group * len(a.uids))
            runs.append(run)
            if self.serverful:
                self.held.append(lease)
        if not plan.keep_unused_warm:  # warm functions this step does not use: a step away at best
            self.pool.stop_idle([lease for lease in self.pool.idle if lease.units > 0], time.time())

        bundle, kv_ref, prefix_of = self._prefill(prompts, plan)
        fault = self.rt.fault
        by_uid = {p.uid: p for p in prompts}
        inflight: dict[ray.ObjectRef, Run] = {}
        assign_refs = []
        for run, a in zip(runs, plan.actors, strict=True):
            work: list[Work] = []
            for uid in a.uids:
                ids = by_uid[uid].prompt_ids
                if uid in prefix_of:
                    work.append((uid, ids, list(range(group)), prefix_of[uid]))
                else:  # no dedup: every sample prefills its whole prompt
                    work.extend((uid, ids, [s], None) for s in range(group))
            run.assigned = {(uid, s) for uid in a.uids for s in range(group)}
            if bundle is not None and not run.colocated:
                used = {prefix_of[uid] for uid in a.uids}
                self.metrics["bytes/kv_transfer"] += sum(bundle.nbytes(i) for i in used)
            after = fault.after if fault and fault.step == step and fault.actor == a.actor else None
            handle = run.lease.handle
            assign_refs.append(handle.assign.remote(work, kv_ref, self.params, step, after))
            inflight[handle.advance.remote(self.rt.slice_s)] = run

        results = self._decode(runs, inflight, step)
        self._finish_runs(runs, assign_refs)
        samples = self._samples(results)
        self.metrics["prefill/tokens_naive"] = float(group * sum(len(p.prompt_ids) for p in prompts))
        self.metrics["actors/planned"] = float(len(plan.actors))
        return samples, dict(self.metrics)

    def _prefill(self, prompts: list[StepPrompt], plan: StepPlan) -> tuple[KVBundle | None, object, dict]:
        """Unique prefix KV on the learner (colocated, current weights), put once for all functions."""
        length = plan.prefix_length if plan.features.get("dedup_prefill") else 0
        if length <= 0:
            return None, None, {}
        start = time.time()
        index: dict[tuple[int, ...], int] = {}
        for p in prompts:
            index.setdefault(tuple(p.prompt_ids[:length]), len(index))
        kvs = self.engine.prefill([list(key) for key in index])
        computed = time.time()
        bundle = KVBundle.pack(kvs)
        ref = ray.put(bundle)
        end = time.time()
        self._on_learner("prefill", start, computed, end)
        self.metrics["time/prefill"] += computed - start
        self.metrics["time/kv_transfer"] += end - computed
        self.metrics["prefill/tokens_computed"] += float(sum(len(k) for k in index))
        return bundle, ref, {p.uid: index[tuple(p.prompt_ids[:length])] for p in prompts}

    def _decode(self, runs: list[Run], inflight: dict, step: int) -> dict[Key, SequenceResult]:
        """Drive the functions slice by slice until every sequence finished; cut, migrate, recover."""
        results: dict[Key, SequenceResult] = {}
        self.last: dict[Key, LiveSequence] = {}
        while inflight:
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            run = inflight.pop(ref)
            try:
                report: Report = ray.get(ref)
            except LOST:
                for new in self._recover(run, runs, step):
                    inflight[new.lease.handle.advance.remote(self.rt.slice_s)] = new
                continue
            self._absorb(run, report, results)
            if run.pending():
                moves = [m for m in decide(self._progress(runs), self.cfg.scheduler) if m.source == run.index]
                if moves:
                    self._migrate(run, moves, runs, step)
            if run.pending():
                inflight[run.lease.handle.advance.remote(self.rt.slice_s)] = run
            else:
                self._done(run)
        return results

    def _absorb(self, run: Run, report: Report, results: dict[Key, SequenceResult]) -> None:
        run.inv.mark_busy(report.begin, report.end)
        for r in report.results:
            key = (r.uid, r.sample)
            results[key] = r
            run.finished.add(key)
            self.last.pop(key, None)
        for live in report.live:
            self.last[(live.uid, live.sample)] = live
        run.free_slots = report.free_slots
        self.metrics["time/prefill"] += report.stats.prefill_seconds
        self.metrics["time/decode"] += report.stats.decode_seconds
        self.metrics["prefill/tokens_computed"] += report.stats.prompt_tokens_computed

    def _progress(self, runs: list[Run]) -> list[ActorProgress]:
        def remaining(key: Key) -> float:
            done = len(self.last[key].generated) if key in self.last else 0
            return max(1.0, self.predicted.get(key[0], 1.0) - done)

        return [
            ActorProgress(
                run.index,
                len(run.finished),
                len(run.assigned),
                run.free_slots,
                not run.done,
                {f"{uid}#{s}": remaining((uid, s)) for uid, s in sorted(run.pending())},
            )
            for run in runs
        ]

    def _migrate(self, source: Run, moves: list[Migration], runs: list[Run], step: int) -> None:
        """Cut `source`'s sequences named in `moves` and resume each on its target function."""
        by_index = {run.index: run for run in runs}
        groups: dict[int, list[Key]] = {}
        for m in moves:
            uid, sample = m.sequence.rsplit("#", 1)
            groups.setdefault(m.target, []).append((uid, int(sample)))
        targets = list(groups)
        start = time.time()
        refs = source.lease.handle.cut.options(num_returns=len(targets) + 1).remote(
            [groups[t] for t in targets], self.rt.migrate_kv
        )
        moved = ray.get(refs[-1])["bytes"]
        now = time.time()
        n = sum(len(keys) for keys in groups.values())
        source.inv.event(now, "cut", n)
        source.inv.event(now, "migrate_out", n)
        for target_index, states_ref in zip(targets, refs[:-1], strict=True):
            target, keys = by_index[target_index], groups[target_index]
            target.lease.handle.resume.remote(states_ref, self.params, step)
            target.assigned |= set(keys)
            target.free_slots -= len(keys)
            source.assigned -= set(keys)
            target.inv.event(now, "migrate_in", len(keys))
        self.metrics["migrations"] += n
        self.metrics["bytes/kv_transfer"] += moved
        self.metrics["time/kv_transfer"] += now - start

    def _recover(self, dead: Run, runs: list[Run], step: int) -> list[Run]:
        """Re-run a dead function's unfinished sequences from their last reported state elsewhere."""
        now = time.time()
        self.pool.drop(dead.lease)
        if dead.lease in self.held:
            self.held.remove(dead.lease)
        dead.done = True
        dead.inv.released = now
        lost = sorted(dead.pending())
        dead.inv.event(now, "fault", len(lost))
        dead.assigned -= set(lost)
        self.metrics["faults"] += 1
        self.metrics["faults/rerun_sequences"] += len(lost)
        if not lost:
            return []
        states = []
        for uid, sample in lost:
            live = self.last.get((uid, sample))
            generated, logprobs = (live.generated, live.logprobs) if live else ([], [])
            self.metrics["faults/resumed_tokens"] += len(generated)
            states.append(SequenceState(uid, sample, self.prompt_ids[uid], generated, logprobs))
        alive = [r for r in runs if not r.done and r.free_slots >= len(lost)]
        new: list[Run] = []
        if alive:
            target = max(alive, key=lambda r: r.free_slots)
        else:
            shape = ("decode", dead.colocated, dead.lease.shape[2])
            lease = self.pool.acquire(shape, now)
            index = max(r.index for r in runs) + 1
            inv = self._open(
                f"decode-{dead.index}-rerun", "decode", lease, dead.inv.units, dead.colocated, now
            )
            lease.units, lease.resources = (0.0 if dead.colocated else inv.units), inv.resources
            target = Run(index, lease, inv, dead.colocated, sync=self._sync(lease, dead.colocated))
            runs.append(target)
            new.append(target)
            if self.serverful:
                self.held.append(lease)
        target.lease.handle.resume.remote(states, self.params, step)
        target.assigned |= set(lost)
        target.free_slots -= len(lost)
        target.inv.event(now, "migrate_in", len(lost))
        return new

    def _done(self, run: Run) -> None:
        """Every sequence of `run` finished: release it now (serverless) or keep holding it (verl)."""
        run.done = True
        if not self.serverful:
            now = time.time()
            run.inv.released = now
            self.pool.release(run.lease, now, keep=run.keep_warm)

    def _finish_runs(self, runs: list[Run], assign_refs: list) -> None:
        """Cold-start times and weight/KV load seconds, read once the functions are done."""
        sync_seconds, assign_seconds = [0.0], [0.0]
        for run in runs:
            self._settle(run.lease, run.inv)
            if run.sync is not None:
                try:
                    sync_seconds.append(ray.get(run.sync))
                except LOST:
                    pass
        for ref in assign_refs:
            try:
                assign_seconds.append(ray.get(ref))
            except LOST:
                pass
        self.metrics["time/weight_sync"] = self.metrics.pop("time/weight_put") + max(sync_seconds)
        self.metrics["time/kv_transfer"] += max(assign_seconds)

    def _samples(self, results: dict[Key, SequenceResult]) -> list[Sample]:
        ordered = [results[key] for key in sorted(results)]
        texts = self.tokenizer.batch_decode([r.response_ids for r in ordered], skip_special_tokens=True)
        return canonical(
            [
                Sample(r.uid, r.sample, list(r.prompt_ids), list(r.response_ids), r.finish_reason, text)
                for r, text in zip(ordered, texts, strict=True)
            ]
        )

    # ----- preparation and learning --------------------------------------------------------

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        """Rewards and reference log-probs in one function, colocated with the learner, released after."""
        now = time.time()
        self.meter.phase("preparation", now)
        lease = self.pool.acquire(("prepare", True, 0), now)
        kind = "reward" if self.reference is None else "reference"
        inv = self._open(kind, kind, lease, 0.0, True, now)
        if self.reference is not None and lease.version is None:
            lease.handle.sync.remote(self.reference_ref, 0)
            lease.version = 0
        out = ray.get(lease.handle.run.remote(prompts, samples))
        self._settle(lease, inv)
        end = time.time()
        inv.mark_busy(out["begin"], out["end"])
        inv.released = end
        self.pool.release(lease, end)
        for s, (score, components) in zip(samples, out["scores"], strict=True):
            s.reward, s.reward_components = score, components
        ref = None if out["ref"] is None else [torch.from_numpy(np.array(a)) for a in out["ref"]]
        return ref, {
            "time/reward": out["time/reward"],
            "time/reference": out["end"] - out["begin"] - out["time/reward"],
        }

    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        start = time.time()
        out = super().policy_logprobs(samples)
        self.learner_inv.mark_busy(start, time.time())
        return out

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        """The critic lives on the learner's resources (colocated, billed through the learner) and
        appears in the timeline as its own function."""
        start = time.time()
        self.meter.phase("learning", start)
        out = super().critic_update(samples, rewards)
        end = time.time()
        self._on_learner("critic", start, end, end)
        return out

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref: list[Tensor] | None,
        old: list[Tensor] | None = None,
    ) -> dict:
        start = time.time()
        if self.meter.phases[-1][0] != "learning":
            self.meter.phase("learning", start)
        metrics = super().learn(samples, advantages, ref, old)
        self.learner_inv.mark_busy(start, time.time())
        return metrics

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        end = time.time()
        for lease in self.held:  # verl: held to the end of the step, then kept for the next
            self.pool.release(lease, end)
        self.held = []
        self.pool.evict(end)
        for span in self.pool.take_spans(end):
            lease = span.lease
            name = f"warm-{lease.shape[0]}-{lease.serial}"
            self.meter.keep_alive(name, lease.units, lease.resources or {}, span.start, span.end)
        metrics, records = self.meter.close_step(end)
        return metrics, {"step": step, "functions": records}

    def warm_functions(self) -> int:
        """Warm decode functions in the pool with resources of their own: the next plan's N of
        them start without a cold start."""
        return sum(1 for lease in self.pool.idle if lease.shape[0] == "decode" and lease.units > 0)

    # ----- state ---------------------------------------------------------------------------

    def load_state_dict(self, state: dict) -> None:
        """Restore the learner; every function re-syncs from the (checkpoint-loaded) policy."""
        super().load_state_dict(state)
        self.weights = None
        for lease in self.pool.idle:
            lease.version = None

    def close(self) -> None:
        self.pool.close()
        if self.owns_ray:
            ray.shutdown()
