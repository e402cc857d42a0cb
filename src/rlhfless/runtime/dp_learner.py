"""The elastic data-parallel learner on Ray: one function per slot, joined by `torch.distributed`.

Rank 0 lives for the whole run on the learner's slot (colocated with the driver, which waits
while it works); it alone owns the optimizer states and steps, and writes them into checkpoints.
Each learning phase takes the planner's width (`planner.learning.learner_width`, priced from the
last phase's learning seconds and rank starts; under a budget or deadline the step plan's,
`StepPlan.learner_width`): ranks 1.. start cold on the slots free once
generation ends, idle warm functions' included where the planner finds stopping them worth their
restart (keep-alive gives way; one placement group: all of them or none), requested once generation's live
forecast is within one measured rank start, so their start overlaps its tail
(`planner.learning.start_ranks_now`), or earlier, when the first of them learns scored groups
ahead (`ahead`). They get rank 0's weights and schedule over the phase's
process group, compute their share of the gradients, which reduces per optimizer step sum on
rank 0 (`data_parallel`: gloo on CPUs, NCCL on GPUs; not sharded with FSDP2, docs/DECISIONS.md),
and are stopped when the phase ends. Each rank is billed per slot from its start to its stop;
rank 0 through the learner, whose slot is billed the whole step. After each update the driver
receives rank 0's weights over a gloo pair of the two (`rank_link`), not the object store: its
engine prefills with them, and checkpoints save them.

Under a serverful policy (`verl`) the phase's width is instead the allocation it holds, as VERL's
hybrid engine trains on the same long-lived workers that generate: one resident rank shares each
held decode function's slot (colocated, asking Ray for nothing, billed through that function,
which is billed the whole step), started the first time the function is held and kept as long as
it is; each phase it joins with rank 0's weights and schedule like any rank, and leaves without
being stopped.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.exceptions import RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from rlhfless.config import Config
from rlhfless.devices import resolve_device
from rlhfless.planner.learning import LearningHistory, learner_width, rank_start_estimate
from rlhfless.runtime.ahead import LearnsAhead, StepAhead
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.executor import LearnerSide
from rlhfless.runtime.learner_rank import LearnerRank, rank_env
from rlhfless.runtime.lifecycle import LOST, Functions, any_lost, gpu_of
from rlhfless.runtime.pool import Lease
from rlhfless.runtime.rank_link import RankLink
from rlhfless.runtime.ray_cluster import await_free, slots_in
from rlhfless.runtime.transfer import Transfer, flat_weights

RELEASE_WAIT_S = 2.0  # at most, for Ray to count a phase's released slots as free again


@dataclass(frozen=True)
class Host:
    """A function the policy holds all step (verl's decode functions, each with a slot of its own):
    its lease, alive as long as the function is, and this step's invocation, billed the whole step."""

    lease: Lease
    inv: Invocation


@dataclass(eq=False)
class Resident:
    """A rank living on a held function's slot for as long as that function is held."""

    handle: Any
    started: bool = False  # its cold start has been awaited (in the phase it was created for)


class ElasticLearner(LearnsAhead, LearnerSide):
    """The driver's side: the policy its engine prefills with, rank 0, and the phase's ranks.
    The verbs of every `LearnerSide`, run on every rank, plus `widen` and `narrow` around the phase."""

    def __init__(self, cfg: Config, policy: torch.nn.Module, tokenizer, functions: Functions) -> None:
        cfg = resolve_device(cfg)  # as the run resolved it (a no-op then): the ranks get it concrete
        super().__init__(cfg, policy, tokenizer)
        self.functions = functions
        self.rank_args = (cfg, len(tokenizer), tokenizer.pad_token_id)
        colocated = NodeAffinitySchedulingStrategy(functions.driver, soft=False)
        # On the learner's slot, which the driver holds: on its GPU, the policy's own.
        device = str(next(policy.parameters()).device)
        self.rank0 = self._create(device, num_cpus=0, num_gpus=0, scheduling_strategy=colocated)
        self.ranks = [self.rank0]
        self.invocations: list[Invocation] = []  # the open phase's, one per rank
        self.group = None  # the open (or prestarted) phase's placement group
        self.phase: dict[str, float] = {}
        self.rank_starts: list[float] = []  # the last phases': request to every rank joined
        self.learned: tuple[int, float] | None = None  # the last elastic phase: width, seconds busy
        self.busy_s = 0.0  # the open phase's seconds in calls on its ranks
        self.restart_s = 0.0  # a warm function's cold start at its next use, as the step's plan prices it
        # A rank's start before this run measured one: as the plan priced it, else (no start was
        # measured on this machine yet: a profile has none) this step's longest function cold start.
        self.prior_start_s = 0.0
        self.planned_width = 0  # the width the step's plan chose under a budget or deadline (0: none)
        self.opened = False  # a learning phase is open (between `widen` and `narrow`)
        self.serverful = cfg.scheduler.policy == "verl"  # learns on its held slots, not free ones
        self.resident: dict[Lease, Resident] = {}  # verl: a rank per held function, by its lease
        self.hosts: list[Invocation] = []  # the open phase's held functions its ranks share
        self.link: RankLink | None = None  # the driver's line to rank 0, for weights and state
        self.step_ahead = StepAhead()  # this step's groups learned ahead (`ahead`)
        self.weighed: dict = {}  # the phase's ranks given the step's published weights: (call, sent)
        self.token_s: float | None = None  # rank-seconds a learned token took, the last phase
        self.phase_tokens = 0  # the open phase's tokens (each group's prompt once)

    def _create(self, device: str, **options):
        return (
            ray.remote(LearnerRank)
            .options(max_restarts=0, runtime_env=rank_env(self.cfg.runtime.learner_mmap_threshold), **options)
            .remote(*self.rank_args, device)
        )

    def prime(self) -> None:
        """Rank 0, the rank that steps, makes its optimizer states now (`learner.prime`): while
        the run's pilot and forecast run, not in step 1's update. Not awaited: rank 0 runs its
        calls in order, so step 1's first call on it starts once this is done."""
        self.rank0.prime.remote()

    def prestart(
        self, meter: Meter, held_slots: int, groups: int, now: float, weights: ray.ObjectRef | None = None
    ) -> None:
        """Start the coming phase's ranks now, on the slots free now, so that their cold start
        runs during generation's tail (`planner.learning.start_ranks_now` says when), and give
        them the step's published `weights` then, so that joining sends none. They are billed
        from their start, as any function holding a slot. Not under verl: it learns on the slots
        it holds (`widen`)."""
        if not self.opened and self.group is None and not self.serverful:
            self._launch(meter, self._width(held_slots, groups, exposed=False), now)
            if weights is not None:
                for rank in self.ranks[1:]:
                    self._weigh(rank, weights)

    def _weigh(self, rank, weights: ray.ObjectRef) -> None:
        """The step's published weights to `rank`, once (queued behind its start)."""
        if rank not in self.weighed:
            self.weighed[rank] = (rank.take_weights.remote(weights), time.time())

    def _record_weights(self, meter: Meter) -> None:
        """Each joined rank's take of the published weights, as one of the step's transfers (a
        take that failed left the rank without them: joining sent rank 0's instead)."""
        for rank, inv in zip(self.ranks[1:], self.invocations[1:], strict=True):
            if rank not in self.weighed:
                continue
            call, sent = self.weighed[rank]
            try:
                seconds, nbytes = ray.get(call)
            except (*LOST, RayTaskError):
                continue
            same = inv.node == self.functions.driver
            meter.transfer(Transfer("weights", "learner", inv.name, nbytes, seconds, same, sent))

    def widen(self, meter: Meter, groups: int, hosts: list[Host], now: float) -> None:
        """Open the learning phase (once a step) on the planner's width: rank 0 and, under verl, the
        resident ranks of the functions it holds (`hosts`); else the ranks `prestart` started, or
        as many as are free now (the `hosts`' slots are not); all joined in one process group."""
        if self.opened:
            return
        self.opened = True
        if self.serverful:
            self._reside(meter, hosts, groups, now)
        elif self.group is None:
            self._launch(meter, self._width(len(hosts), groups, exposed=True), now)
        rank0 = Invocation(
            "learner-0",
            "learner",
            dict(self.functions.slot),
            0.0,
            now,
            now,
            now,
            colocated_with="learner",
            node=self.functions.driver,
        )
        self.invocations.insert(0, meter.open(rank0))
        self.phase = {"faults/learner": 0.0, "learner/weights_sent": 0.0}
        width = self._join() if len(self.ranks) > 1 else 1
        self.phase |= {"learner/width": float(width), "time/learner_start": time.time() - now}
        if width > 1:
            self._record_weights(meter)

    def _width(self, held_slots: int, groups: int, exposed: bool) -> int:
        """The planner's width for ranks requested now: during generation's tail (their start
        hidden) or as the phase opens (`exposed`: learning waits for it); the step plan's where a
        budget or deadline chose it."""
        view = self.functions.cluster()
        warm = sum(1 for lease in self.functions.pool.idle if lease.units > 0)
        free = sum(n.total for n in view.nodes) - held_slots - warm
        history = None
        if self.learned is not None and self.rank_start_s is not None:
            history = LearningHistory(*self.learned, self.rank_start_s)
        width = learner_width(
            self.cfg.runtime.learner_width or self.planned_width,
            free,
            groups,
            history,
            self.cfg.scheduler,
            warm,
            self.restart_s,
            exposed,
        )
        self._give_way(width - max(free, 1))
        return width

    def _give_way(self, slots: int) -> None:
        """Keep-alive gives way to the phase: stop this many idle warm functions (the driver's
        node's first, where the ranks pack), so that their slots can take ranks."""
        if slots <= 0:
            return
        idle = [lease for lease in self.functions.pool.idle if lease.units > 0]
        idle.sort(key=lambda lease: lease.shape[2] != self.functions.driver)
        self.functions.pool.stop_idle(idle[:slots], time.time())

    def _launch(self, meter: Meter, width: int, now: float) -> None:
        """Request ranks 1.. of `width` on one placement group (all placed or none), without
        waiting: their processes start while the driver goes on."""
        if width < 2:
            return
        slot, units = dict(self.functions.slot), float(self.cfg.scheduler.gpus_per_actor)
        self.group = placement_group([slot] * (width - 1), strategy="PACK")
        resources = {"num_cpus": 0, "num_gpus": units} if "GPU" in slot else {"num_cpus": slot["CPU"]}
        for r in range(1, width):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=r - 1)
            self.ranks.append(
                self._create(self.cfg.runtime.device, scheduling_strategy=strategy, **resources)
            )
            inv = Invocation(
                f"learner-{r}", "learner", slot, units, requested=now, cold=True, phase="learning"
            )
            self.invocations.append(meter.open(inv))

    def _reside(self, meter: Meter, hosts: list[Host], groups: int, now: float) -> None:
        """verl: ranks 1.. of the width its held allocation gives (`runtime.learner_width` and the
        step's prompt groups may ask fewer), one on each host's slot. A resident rank whose function
        is no longer held (dropped by a fault, released by a plan that needs fewer) is stopped; a
        host without one gets one, cold this phase, later phases warm."""
        held = {host.lease for host in hosts}
        self.retire(held)
        width = learner_width(self.cfg.runtime.learner_width, 1 + len(hosts), groups)
        for r, host in enumerate(hosts[: width - 1], start=1):
            resident = self.resident.get(host.lease)
            if resident is None:
                resident = self.resident[host.lease] = self._settle_on(host)
            cold = not resident.started
            inv = Invocation(
                f"learner-{r}",
                "learner",
                dict(host.inv.resources),
                0.0,
                requested=now,
                started=None if cold else now,
                ready=None if cold else now,
                colocated_with=host.inv.name,
                cold=cold,
                node=host.lease.shape[2],
            )
            self.ranks.append(resident.handle)
            self.invocations.append(meter.open(inv))
            self.hosts.append(host.inv)

    def _settle_on(self, host: Host) -> Resident:
        """A rank on `host`'s slot: on its node, asking Ray for nothing (the host holds the slot),
        on the host's GPU when the run is on GPUs."""
        device = self.cfg.runtime.device
        if device == "cuda":  # a process that asks for no GPU sees every GPU of its node
            device = f"cuda:{ray.get(host.lease.handle.__ray_call__.remote(gpu_of))}"
        on_node = NodeAffinitySchedulingStrategy(host.lease.shape[2], soft=False)
        handle = self._create(device, num_cpus=0, num_gpus=0, scheduling_strategy=on_node)
        return Resident(handle)

    def retire(self, held: set[Lease]) -> None:
        """Stop the resident ranks whose function is not among `held` (gone, or no longer the
        policy's): a rank lives no longer than the function whose slot it shares."""
        for lease in [lease for lease in self.resident if lease not in held]:
            ray.kill(self.resident.pop(lease).handle)

    def _join(self) -> int:
        """Ranks 1.. placed and started, joined with rank 0; the width got (1 when Ray could not
        place them in `runtime.place_timeout_s`: their slots were taken)."""
        extra = self.invocations[1:]
        if self.group is not None and not self._placed(extra):
            return 1
        try:  # the cold ones' starts; a resident from an earlier phase answers at once, or is gone
            hellos = ray.get([rank.hello.remote() for rank in self.ranks[1:]])
        except LOST:
            self._lost_ranks(joined=False)
            return 1
        for inv, hello in zip(extra, hellos, strict=True):
            if inv.cold:
                inv.started, inv.ready = max(inv.requested, hello.started), hello.ready
                inv.node = hello.node
        for resident in self.resident.values():
            resident.started = True
        joining = time.time()
        address, port = ray.get(self.rank0.address.remote())
        width = len(self.ranks)
        sent = ray.get([rank.join.remote(address, port, r, width) for r, rank in enumerate(self.ranks)])
        self.phase["learner/weights_sent"] = float(sent[0])
        if self.group is not None:  # the elastic ranks' start, which `prestart` times
            ready = max(hello.ready for hello in hellos)
            self.rank_starts = [
                *self.rank_starts[-2:],
                ready - extra[0].requested + time.time() - max(joining, ready),
            ]
            self.phase["time/rank_start"] = self.rank_starts[-1]  # the run memory keeps it
        return width

    def _placed(self, extra: list[Invocation]) -> bool:
        """Whether Ray placed the elastic ranks' group within `runtime.place_timeout_s` of their
        request; if not, they are stopped, never started, so never billed."""
        waited = time.time() - extra[0].requested
        if self.group.wait(max(0.0, self.cfg.runtime.place_timeout_s - waited)):
            return True
        for rank in self.ranks[1:]:
            ray.kill(rank)
        remove_placement_group(self.group)
        for inv in extra:
            inv.released = time.time()
        self.ranks, self.invocations, self.group = [self.rank0], self.invocations[:1], None
        return False

    @property
    def rank_start_s(self) -> float | None:
        """The rank start to expect (`planner.learning.rank_start_estimate`): learning that waits
        for a rank costs every slot of the step, a rank started early only its own."""
        return rank_start_estimate(self.rank_starts, self.prior_start_s)

    def narrow(self, now: float) -> None:
        """Close the learning phase: ranks 1.. leave the group, the elastic ones stopped and
        released (resident ones stay, on their held slots), rank 0 alone again. What the phase
        measured prices the next: its learning seconds, those learned ahead spread over its width
        as the phase would have spent them, and its seconds a token."""
        if not self.serverful and self.busy_s > 0:
            width, ahead_s = len(self.ranks), self.step_ahead.seconds
            self.learned = (width, self.busy_s + ahead_s / width)
            if self.phase_tokens:
                self.token_s = (width * self.busy_s + ahead_s) / self.phase_tokens
        self.busy_s, self.phase_tokens, self.step_ahead = 0.0, 0, StepAhead()
        if len(self.ranks) > 1:
            ray.get([rank.leave.remote() for rank in self.ranks])
            if not self.serverful:
                slot = self.functions.slot
                free = slots_in(ray.available_resources(), slot) + len(self.ranks) - 1
                for rank in self.ranks[1:]:
                    ray.kill(rank)
                remove_placement_group(self.group)
                await_free(slot, free, RELEASE_WAIT_S)  # the next step's plan sees them free
        for inv in self.invocations:
            inv.released = now
        self.ranks, self.invocations, self.group, self.opened = [self.rank0], [], None, False
        self.hosts, self.weighed = [], {}

    def _run(self, method: str, *args):
        """`method` on every rank of the phase (the args put once), busy while it runs; rank 0's
        result. A lost rank beyond rank 0 costs the phase its width, not the step (`_lost_ranks`)."""
        refs = [ray.put(a) for a in args]
        before = ray.get(self.rank0.updates.remote()) if len(self.ranks) > 1 else None
        begin = time.time()
        with ExitStack() as busy:
            busy.callback(self._count_busy, begin)
            for inv in [*self.invocations, *self.hosts]:  # a host's slot is busy while its rank is
                busy.enter_context(inv.busy_while())
            calls = [getattr(rank, method).remote(*refs) for rank in self.ranks]
            try:
                return ray.get(calls)[0]
            except (*LOST, RayTaskError):
                if before is None or not any_lost(calls[1:]):
                    raise
            try:
                done = ray.get(calls[0])  # rank 0 finished before the peer was lost
            except RayTaskError:  # it failed in a collective with the lost peer
                done = None
        self._lost_ranks()
        if done is not None:
            return done
        if ray.get(self.rank0.updates.remote()) != before:
            raise RuntimeError(
                f"learning: a learner rank was lost during {method} after rank 0 had stepped; "
                "expected to redo it on rank 0 alone, so resume the run from its last checkpoint"
            )
        return self._run(method, *args)

    def _count_busy(self, begin: float) -> None:
        """The open phase's learning seconds (its width's price, `_width`), its start not included."""
        if self.opened:
            self.busy_s += time.time() - begin

    def _lost_ranks(self, joined: bool = True) -> None:
        """A rank beyond rank 0 died (its process, its node), in the phase or before it `joined`:
        every rank but rank 0 is stopped and released, resident ones too (their peers may be stuck
        in the broken group's collectives; the next phase starts new ones on the slots still held),
        rank 0 leaves the broken group, and the phase goes on at width 1."""
        now = time.time()
        for inv in self.invocations[1:]:
            inv.started = inv.started or inv.requested  # placed, if not yet heard from
            inv.released = now
            inv.event(now, "fault", 1)
        for rank in self.ranks[1:]:
            ray.kill(rank)
        self.resident = {
            lease: r for lease, r in self.resident.items() if all(r.handle is not k for k in self.ranks)
        }
        if self.group is not None:
            remove_placement_group(self.group)
        if joined:
            ray.get(self.rank0.leave.remote())
        self.ranks, self.invocations, self.group = [self.rank0], self.invocations[:1], None
        self.hosts = []
        self.phase["learner/width"] = 1.0
        self.phase["faults/learner"] = self.phase.get("faults/learner", 0.0) + 1

    def _phase(self) -> dict:
        return self.phase

    def _synced(self) -> dict:
        """The driver's policy (its engine's, the checkpoints') loaded from rank 0 over the link."""
        start = time.perf_counter()
        with torch.no_grad():
            self._link().receive(self.rank0.send_weights.remote(), list(self.policy.parameters()))
        return {"time/learner_sync": time.perf_counter() - start}

    def _save(self, path: str, extra: dict) -> None:
        """Rank 0 writes its learner state itself: it runs on the driver's node (hard affinity),
        so the checkpoint's folder is its too, and the 1.08 GB of the default model's optimizer
        states never sit in the driver, whose last step's checkpoint was its peak (3.7-4.2 GB)."""
        ray.get(self.rank0.save_state.remote(path, extra))

    def _link(self) -> RankLink:
        """The line to rank 0 (`rank_link`), opened on first use: rank 0 starts meanwhile."""
        if self.link is None:
            self.link = RankLink(self.rank0)
        return self.link

    def _load(self, path: str) -> int:
        """A resumed run: rank 0 takes the checkpoint's policy (already in the driver's) and reads
        its state from `path` itself (its node is the driver's)."""
        return ray.get(self.rank0.load.remote(flat_weights(self.policy), path))

    def close(self) -> None:
        """Stop every rank, without waiting on a phase an error may have left in a collective."""
        self.link = None
        for rank in self.ranks:
            ray.kill(rank)
        self.retire(set())
        if self.group is not None:
            remove_placement_group(self.group)
