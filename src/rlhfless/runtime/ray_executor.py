"""The serverless executor: each step's plan runs as short-lived functions on Ray, metered.

The driver holds the policy for the whole run and is also the prefill function: it computes the
step's unique prefix KV on the current weights, with no sync. The learner is data parallel
(`dp_learner`): rank 0 on the learner's slot all run, more ranks on released slots while it learns
(under `verl`, one resident rank on each held decode function's slot instead), the driver's
weights loaded from rank 0 after each update. Decode functions are
leased per step on the nodes the plan names (`lifecycle`), get the new weights and the prefix KV
through the object store (`publishing`), and are driven by one `DecodeRound` per step. The plan is
made for the cluster Ray reports at the start of the step (`cluster`). Preparation (rewards, the
reference's log-probs) runs by prompt group, overlapped with generation's tail when the plan says
so (`preparation`); with a group-local estimator, scored groups are learned ahead on the learning
phase's first extra rank, started early for them (`ahead`).

Billing (the one pricing model, through the meter): the learner's resources for the whole step
under every policy, and its ranks beyond rank 0 per slot while they are held; the prefill
function, rank 0, the decode function the plan colocates with the learner, and the
reference/reward function share the learner's resources and are billed once; verl's resident
ranks share their held decode functions' and are billed through them. Other decode functions are
billed while leased, then while warm in the pool; at release each is kept warm or stopped as the
plan says; one that prepares groups in the tail first is billed meanwhile as a function of its own.
Under `verl` they are held for the whole step, as a serverful deployment would.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray
import torch
from torch import Tensor

from rlhfless.config import Config
from rlhfless.devices import resolve_device
from rlhfless.engine.sampling import SamplingParams
from rlhfless.models import model_shape
from rlhfless.planner.learning import learn_ahead_fits, start_ranks_ahead, start_ranks_now
from rlhfless.planner.placement import ClusterSpec
from rlhfless.planner.step_plan import StepPlan
from rlhfless.rewards import RewardFn
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.decode_round import DecodeRound
from rlhfless.runtime.dp_learner import ElasticLearner, Host
from rlhfless.runtime.lifecycle import Functions
from rlhfless.runtime.machine import learner_threads
from rlhfless.runtime.pool import Lease
from rlhfless.runtime.prefixes import prefill_metrics, prefix_tree
from rlhfless.runtime.preparation import Preparation
from rlhfless.runtime.publishing import PrefixKV, Weights, publish_prefix_kv
from rlhfless.runtime.ray_cluster import ClusterView, start_ray
from rlhfless.runtime.returns import advantages, group_local
from rlhfless.runtime.samples import Sample, StepPrompt, canonical, decoded
from rlhfless.runtime.transfer import flat_weights
from rlhfless.runtime.validation import Decoded


class RayExecutor:
    """Executes step plans on Ray functions; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None,
        tokenizer,
        reward_fn: RewardFn,
    ) -> None:
        cfg = resolve_device(cfg)  # as the run resolved it (a no-op then)
        self.cfg, self.tokenizer = cfg, tokenizer
        self.owns_ray = start_ray(cfg.runtime)
        gpu = cfg.runtime.device == "cuda"  # slots are GPUs; every function puts its model on one
        self.driver = ray.get_runtime_context().get_node_id()
        learner_device = str(next(policy.parameters()).device)
        self.functions = Functions(cfg, tokenizer, reference is not None, gpu, self.driver, learner_device)
        self.learner = ElasticLearner(cfg, policy, tokenizer, self.functions)  # and the prefill engine
        self.policy, self.engine = policy, self.learner.engine
        self.meter = Meter(cfg.scheduler.pricing)
        self.weights = Weights(policy)
        # The reference's flat weights in the object store, and their bytes (None: no KL penalty).
        self.reference = None
        if reference is not None:
            flat = flat_weights(reference)
            self.reference = (ray.put(flat), int(flat.nbytes))
        self.shape = model_shape(policy)
        if not gpu:
            # The learner's slot (the driver's prefill, then rank 0's learning) is one CPU slot
            # like every function's: more threads would use cores that nobody is billed for.
            torch.set_num_threads(learner_threads(cfg))
        self.view: ClusterView | None = None  # the cluster the next plan is made for
        self.held: list[Lease] = []
        self.hosts: list[Host] = []  # verl: the held decode functions with slots of their own
        self.learner_inv: Invocation | None = None
        self.timeline_nodes: list[dict] = []  # the nodes the last step was planned and placed on
        self.preparation: Preparation | None = None  # the step's, from its generation on

    def cluster(self) -> ClusterSpec:
        """The cluster as Ray reports it now: the next plan is made for it and placed on it."""
        self.view = self.functions.cluster()
        return self.view.spec(self.cfg.scheduler.gpus_per_actor, self.shape)

    # ----- generation ----------------------------------------------------------------------

    def generate(self, prompts: list[StepPrompt], plan: StepPlan, step: int) -> tuple[list[Sample], dict]:
        self._begin(time.time())
        self.learner.restart_s = plan.profile.cold_start_s if plan.profile else 0.0
        self.learner.prior_start_s = plan.rank_start_s
        self.learner.planned_width = plan.learner_width
        overlap = bool(plan.features.get("overlap_preparation"))  # rlhfless only
        ahead = overlap and self._learns_ahead(plan)
        self.preparation = Preparation(
            self.cfg,
            self.functions,
            self.meter,
            self.tokenizer,
            prompts,
            self.reference,
            step,
            overlap,
            eager=ahead and self.reference is None,
        )
        round_, view, kv, (ref, put_s) = self._open_round(
            prompts, plan, step, self.learner.params, self.preparation
        )
        results = round_.run(tick=self._prestarter(len(prompts), ref, ahead))
        self.preparation.end_generation(time.time())
        round_.settle(kv)
        # verl's held functions as generation left them: none a fault dropped, their replacements in
        self.held += round_.held
        self.hosts = [
            Host(r.lease, r.inv) for r in round_.runs if r.lease in round_.held and r.lease.units > 0
        ]

        metrics = round_.metrics
        metrics["time/weight_sync"] += put_s
        if kv is not None:
            metrics["time/prefill"] += kv.computed - kv.start
            metrics["time/kv_transfer"] += kv.put - kv.computed
            metrics["prefill/tokens_computed"] += float(kv.tokens_computed)
        metrics["prefill/tokens_naive"] = float(
            self.cfg.algorithm.group_size * sum(len(p.prompt_ids) for p in prompts)
        )
        metrics.update(prefill_metrics(plan, metrics["prefill/tokens_computed"]))
        metrics["actors/planned"] = float(len(plan.actors))
        metrics["cluster/nodes"] = float(len(view.nodes))
        ordered = [results[key] for key in sorted(results)]
        self.timeline_nodes = view.to_dict()
        return canonical(decoded(ordered, self.tokenizer)), dict(metrics)

    def validate(
        self, prompts: list[StepPrompt], plan: StepPlan, params: SamplingParams, group: int, stream: int
    ) -> Decoded:
        """A validation between steps on the decode functions `plan` names, as a step's
        generation runs (weights, prefix KV, cut and migrate, recovery) with no preparation:
        `group` responses to each prompt, sampled on key step `stream`. Metered as a step of its
        own: the learner's resources, the functions, and warm ones idle meanwhile; its timeline
        is kept as a step's is."""
        self._begin(time.time())
        round_, view, kv, _ = self._open_round(prompts, plan, stream, params, None, group)
        results = round_.run()
        round_.settle(kv)
        end = time.time()
        for lease in round_.held:  # verl: held to the end, then kept for the next step
            self.functions.pool.release(lease, end)
        billing, records = self._close_meter(end)
        ordered = [results[key] for key in sorted(results)]
        figures = {
            "cost": billing["cost/step"],
            "actors": float(len(plan.actors)),
            "predicted_time": plan.predicted_time,
            "predicted_cost": plan.predicted_cost,
            "migrations": round_.metrics["migrations"],
        }
        timeline = {
            "nodes": view.to_dict(),
            "functions": records,
            "transfers": self.meter.transfer_records(),
        }
        return Decoded(canonical(decoded(ordered, self.tokenizer)), figures, {"timeline": timeline})

    def _begin(self, now: float) -> None:
        """A metered window (a step, or a validation between steps) opens with the learner's
        resources, held for all of it."""
        self.meter.begin_step(now)
        units = float(self.cfg.scheduler.gpus_per_actor)
        self.learner_inv = self.meter.open(
            Invocation(
                "learner", "learner", dict(self.functions.slot), units, now, now, now, node=self.driver
            )
        )

    def _open_round(
        self,
        prompts: list[StepPrompt],
        plan: StepPlan,
        step: int,
        params: SamplingParams,
        preparation: Preparation | None,
        group: int | None = None,
    ) -> tuple[DecodeRound, ClusterView, PrefixKV | None, tuple[ray.ObjectRef, float]]:
        """The plan's decode functions leased with this version's weights (put once), warm ones
        the plan does not use stopped where it says so, the prefix tree prefilled on the learner
        and its KV published, and every function assigned its prompts: the round, the cluster it
        runs on, the KV, and the weights' ref with the seconds putting them took."""
        view, self.view = self.view or self.functions.cluster(), None
        self.policy.eval()
        with self.learner_inv.busy_while():
            ref, nbytes, put_s = self.weights.publish(self.learner.version)
        round_ = DecodeRound(
            self.cfg, self.functions, self.meter, view, prompts, plan, step, params, preparation, group
        )
        round_.lease((ref, nbytes, self.learner.version))
        if not plan.keep_unused_warm:  # warm functions this plan does not use: a step away at best
            pool = self.functions.pool
            pool.stop_idle([lease for lease in pool.idle if lease.units > 0], time.time())
        kv = publish_prefix_kv(self.learner.engine, prefix_tree(plan, prompts))
        if kv is not None:
            self._on_learner("prefill", kv.start, kv.computed, kv.put)
        round_.assign(kv)
        return round_, view, kv, (ref, put_s)

    def _close_meter(self, end: float) -> tuple[dict, list[dict]]:
        """The meter closed at `end`, with the pool's warm functions' idle spans since it last
        closed billed as keep-alive (their part inside this window)."""
        for span in self.functions.pool.take_spans(end):
            lease = span.lease
            name = f"warm-{lease.shape[0]}-{lease.serial}"
            self.meter.keep_alive(
                name, lease.units, lease.resources or {}, span.start, span.end, lease.shape[2]
            )
        return self.meter.close_step(end)

    def _on_learner(self, kind: str, start: float, done: float, end: float) -> None:
        """Record a function that ran inside the learner (busy until `done`, alive until `end`):
        on its resources, billed through it."""
        inv = Invocation(
            kind,
            kind,
            dict(self.functions.slot),
            0.0,
            start,
            start,
            start,
            colocated_with="learner",
            node=self.driver,
        )
        self.meter.open(inv).mark_busy(start, done)
        inv.released = end
        self.learner_inv.mark_busy(start, end)

    # ----- preparation and learning --------------------------------------------------------

    def prepare(self, prompts: list[StepPrompt], samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        """What generation's tail left unprepared, on the prepare function (colocated with the
        learner); every sample scored (`preparation`)."""
        self.meter.phase("preparation", time.time())
        return self.preparation.finish(samples)

    def policy_logprobs(self, samples: list[Sample]) -> list[Tensor]:
        with self.learner_inv.busy_while():
            return self.learner.policy_logprobs(samples)

    def critic_update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict]:
        """The critic lives on the learner's resources (colocated, billed through the learner) and
        appears in the timeline as its own function."""
        start = time.time()
        self.meter.phase("learning", start)
        self._widen(samples, start)
        out = self.learner.critic_update(samples, rewards)
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
        if self.meter.phases[-1][0] != "learning":
            self.meter.phase("learning", time.time())
        with self.learner_inv.busy_while():
            self._widen(samples, time.time())
            return self.learner.learn(samples, advantages, ref, old)

    def _widen(self, samples: list[Sample], now: float) -> None:
        """The learning phase on the planner's width: under verl on the allocation it holds, the
        learner's slot and every held decode function's; else on the slots free now."""
        self.learner.widen(self.meter, len({s.uid for s in samples}), self.hosts, now)

    def _learns_ahead(self, plan: StepPlan) -> bool:
        """Whether this step may learn groups ahead (`ahead`): the plan says so, its estimator is
        group-local with one update, and a phase was measured (its seconds a token, its ranks' start)."""
        learner = self.learner
        return (
            bool(plan.features.get("learn_ahead"))
            and group_local(self.cfg.algorithm)
            and learner.token_s is not None
            and learner.rank_start_s is not None
        )

    def _prestarter(self, groups: int, weights: ray.ObjectRef, ahead: bool):
        """Called at each decode report: once generation's live forecast is within one rank start,
        the learning phase's extra ranks start on the slots free then, those that decode
        functions prepare on and then free included (`Preparation.holding`), and take the step's
        published `weights`: once ranks are requested, decode functions take no new group. With
        `ahead`, scored groups are learned ahead: the ranks start earlier, once the groups waiting
        would keep the first busy until generation ends (`start_ranks_ahead`), and it takes each
        that can still be learned before then."""
        tried = False  # learning ahead asked for the ranks this step

        def tick(round_: DecodeRound) -> None:
            nonlocal tried
            left = round_.left_s()
            if not self.learner.prior_start_s:  # no start measured before the plan: this step's
                self.learner.prior_start_s = self.meter.cold_start_s() or 0.0
            if ahead:
                waiting = self._scored_waiting()
                if waiting and not tried and self.learner.group is None:
                    each = [self.learner.group_s(samples) or 0.0 for samples, _ in waiting]
                    if start_ranks_ahead(left, self.learner.rank_start_s, sum(each), min(each)):
                        tried = True
                        self._prestart(groups, weights)
                if waiting and self.learner.ahead_rank() is not None:
                    self._learn_ahead(weights, waiting, left)
            if start_ranks_now(left, self.learner.rank_start_s):
                self._prestart(groups, weights)

        return tick

    def _prestart(self, groups: int, weights: ray.ObjectRef) -> None:
        leased = sum(1 for lease in self.functions.pool.leased if lease.units > 0)
        held = leased - self.preparation.holding()
        self.learner.prestart(self.meter, held, groups, time.time(), weights)
        if self.learner.group is not None:
            self.preparation.hand_back()

    def _scored_waiting(self) -> list[tuple[list[Sample], list[Tensor] | None]]:
        """Scored groups not yet learned ahead, with their reference log-probs."""
        self.learner.step_ahead.poll()
        sent = self.learner.step_ahead.sent
        return [self.preparation.group(uid) for uid in self.preparation.scored() if uid not in sent]

    def _learn_ahead(
        self,
        weights: ray.ObjectRef,
        waiting: list[tuple[list[Sample], list[Tensor] | None]],
        left: float | None,
    ) -> None:
        """The first waiting group the ahead rank can learn before generation is forecast to end,
        once its last call is back: each is sent with the freshest forecast (a call queued behind
        another, on an older one, ran 3.3 s past generation's end and the phase waited for it)."""
        if self.learner.step_ahead.calls:
            return
        for samples, ref in waiting:
            if learn_ahead_fits(left, self.learner.queued_s(time.time()), self.learner.group_s(samples)):
                self.learner.learn_ahead(weights, samples, advantages(self.cfg, samples), ref)
                return

    def finish_step(self, step: int) -> tuple[dict, dict | None]:
        end = time.time()
        self.learner.narrow(end)
        pool = self.functions.pool
        for lease in self.held:  # verl: held to the end of the step, then kept for the next
            pool.release(lease, end)
        self.held, self.hosts = [], []
        pool.evict(end)
        self.learner.retire({*pool.idle, *pool.leased})  # verl: a stopped function's rank with it
        metrics, records = self._close_meter(end)
        metrics |= object_store()
        if "decode" in pool.prestart_s:  # the host decode function's whole start, once
            metrics["time/host_start"] = pool.prestart_s.pop("decode")
        transfers = self.meter.transfer_records()
        return metrics, {
            "step": step,
            "nodes": self.timeline_nodes,
            "functions": records,
            "transfers": transfers,
            "preparation": self.preparation.timeline(self.meter.origin),
        }

    def warm_up(self) -> None:
        """Start the decode function colocated with the learner (every plan's slot 0, which the
        planner takes to be warm) and the prepare function (every step scores there): they hold
        no resources of their own, so their starts overlap the run's pilot and forecast for free,
        where step 1 waited for each in turn (7-14 s apiece on a 2-core machine). The prepare
        function starts once the decode function is ready: step 1 waits for that one first, and
        the two starting together on two cores took the decode function 6.8-7.7 s, alone 4.4-4.8
        s (docs/DECISIONS.md). And rank 0 makes its optimizer states (`ElasticLearner.prime`)."""
        self.functions.prestart("decode")
        self.functions.prestart("prepare", after="decode")
        self.learner.prime()

    def warm_functions(self) -> int:
        """Warm decode functions in the pool with resources of their own: the next plan's N of
        them start without a cold start."""
        return self.functions.warm()

    def host_starting_s(self) -> float | None:
        return self.functions.host_starting_s()

    # ----- state ---------------------------------------------------------------------------

    def save_state(self, path: Path) -> None:
        self.learner.save_state(path)

    def load_state(self, path: Path) -> None:
        """Restore the learner; every function re-syncs from the (checkpoint-loaded) policy."""
        self.learner.load_state(path)
        self.weights.forget()
        for lease in self.functions.pool.idle:
            lease.version = None

    def close(self) -> None:
        self.learner.close()
        self.functions.close()
        if self.owns_ray:
            ray.shutdown()


def object_store() -> dict[str, float]:
    """What the cluster's object stores hold at the end of a step (Ray's `ray memory --stats-only`
    numbers: only a private call reads them in-process): a leak of references across steps shows
    as growth here. Empty when Ray cannot say."""
    from ray._private.internal_api import get_memory_info_reply
    from ray._private.state import state

    try:
        stats = get_memory_info_reply(state).store_stats
    except Exception:  # noqa: BLE001 -- a measurement only; the step does not depend on it
        return {}
    return {
        "ray/object_store_mib": stats.object_store_bytes_used / 2**20,
        "ray/object_store_objects": float(stats.num_local_objects),
    }
