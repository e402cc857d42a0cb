"""One step's preparation on Ray: rewards and, with a KL penalty, the reference's log-probs, by
prompt group, overlapped with generation's tail when the plan says so (`overlap_preparation`).

A group can be prepared as soon as all G of its samples have finished: preparation reads only
finished samples and the frozen reference, so doing it early changes no reward, log-prob,
advantage or update (not a bit: the reference runs one group per pass, `functions.Preparer`).
While other groups still decode, ready groups go to a preparer that is idle:
- all of them to the prepare function on the learner's slot, once no decode function runs there
  (the slot is billed all step, so the work costs nothing more);
- else one a call to a decode function that finished while others decode: its slot is held on as
  a `reference` (or `reward`) function, billed on its own; it loads the reference's weights and
  prepares, and is released as the plan said once no ready group is left for it, or once the
  learning phase's ranks are requested for the slots generation released (`hand_back`).
What is left when generation ends runs on the prepare function, as without overlap. A preparer
that dies hands its groups back; the prepare function is replaced, at most `PREPARE_ATTEMPTS`
times a step. Every call is an actor call: `DecodeRound` waits on them with its own (`ray.wait`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import ray
import torch
from torch import Tensor

from rlhfless.config import Config
from rlhfless.engine.sequences import SequenceResult
from rlhfless.runtime.billing import Invocation, Meter
from rlhfless.runtime.lifecycle import LOST, Functions
from rlhfless.runtime.pool import Lease
from rlhfless.runtime.samples import Sample, StepPrompt, decoded
from rlhfless.runtime.transfer import Transfer

Key = tuple[str, int]  # (uid, sample index)
PREPARE_ATTEMPTS = 4  # prepare functions a step may start before it gives up (each died)


@dataclass(eq=False)
class Worker:
    """A function preparing groups this step: the prepare function, or a decode function's slot."""

    lease: Lease
    inv: Invocation | None  # a decode function's: opened by its first call
    learner: bool  # the prepare function on the learner's slot
    keep_warm: bool = True  # a decode function's, at release
    decoded: Invocation | None = None  # a decode function's decoding, whose slot it prepares on
    keys: list[Key] = field(default_factory=list)  # its call's samples, in the order sent
    armed: bool = False  # its call carries the step's injected prepare fault


class Preparation:
    """The step's preparation: fed finished sequences during generation, finished after it."""

    def __init__(
        self,
        cfg: Config,
        functions: Functions,
        meter: Meter,
        tokenizer,
        prompts: list[StepPrompt],
        reference: tuple[ray.ObjectRef, int] | None,
        step: int,
        overlap: bool,
        eager: bool = False,
    ) -> None:
        """`reference`: the reference's flat weights in the object store and their bytes (None:
        no KL penalty, rewards only); `overlap`: prepare groups during generation; `eager`: on
        the prepare function even while a decode function runs on the learner's slot (rewards
        only, a short call: for groups learned ahead, `ahead`)."""
        self.cfg, self.functions, self.meter, self.tokenizer = cfg, functions, meter, tokenizer
        self.prompts = {p.uid: p for p in prompts}
        self.reference, self.step, self.overlap, self.eager = reference, step, overlap, eager
        self.kind = "reward" if reference is None else "reference"
        self.setup = functions.prep_setup()
        self.finished: dict[str, dict[int, SequenceResult]] = {}
        self.groups: dict[str, tuple[list[Sample], list[Tensor] | None]] = {}  # scored, as `group` built them
        self.ready: list[str] = []  # groups whose samples have all finished, not sent yet
        self.calls: dict[ray.ObjectRef, Worker] = {}
        self.idle: list[Worker] = []  # decode functions between calls
        self.prepare_fn: Worker | None = None  # the learner's prepare function, once leased
        self.handed_back = False  # decode functions' slots are the learning phase's now
        self.started = 0  # prepare functions started this step
        self.fault = cfg.runtime.fault_plan.prepare(step)  # injected into its first call
        self.fault_due = self.fault != (False, 0.0)
        self.scores: dict[Key, tuple[float, dict[str, float]]] = {}
        self.ref: dict[Key, np.ndarray] = {}
        self.spans: list[dict] = []  # each call: function, begin, end, groups (absolute times)
        self.generation_end: float | None = None
        self.metrics = dict.fromkeys(
            ("faults/prepare", "faults/prepare_injected", "time/reward", "time/reference"), 0.0
        )

    # ----- during generation (`DecodeRound`) -----------------------------------------------

    def add(self, results: list[SequenceResult]) -> None:
        """Finished sequences; a group whose G samples are all in is ready."""
        group = self.cfg.algorithm.group_size
        for r in results:
            done = self.finished.setdefault(r.uid, {})
            done[r.sample] = r
            if len(done) == group:
                self.ready.append(r.uid)

    def offer(self, lease: Lease, decoded: Invocation, keep_warm: bool) -> None:
        """A decode function done while others decode: its slot may prepare (`feed`)."""
        self.idle.append(Worker(lease, None, False, keep_warm, decoded))

    def feed(self, learner_free: bool) -> None:
        """While generation runs: the ready groups to the prepare function when the learner's
        slot is free (no decode function there) and it is idle (and started, unless a decode
        function is idle), else one group to each idle decode function, until the learning
        phase's ranks want the slots (`hand_back`); decode functions left with nothing are
        released."""
        idle, self.idle = self.idle, []
        if self.overlap and self.ready and (learner_free or self.eager) and self._prepare_fn_idle():
            if not idle or self._prepare_fn_started():
                self._send(self._prepare_fn(), self._take())
        for p in idle:
            if self.overlap and self.ready and not self.handed_back:
                self._send(p, self._take(1))
            else:
                self._release(p)

    def hand_back(self) -> None:
        """The learning phase's ranks are about to start on the slots generation released: no
        decode function's slot takes another group (a call under way ends first)."""
        self.handed_back = True

    def holding(self) -> int:
        """Slots held for preparing now that their release frees (their decode functions are
        stopped then, not kept warm): as free for the learning phase as if released already."""
        return sum(1 for p in self.calls.values() if not p.learner and not p.keep_warm)

    def refs(self) -> list[ray.ObjectRef]:
        return list(self.calls)

    def absorb(self, ref: ray.ObjectRef) -> None:
        """A call came back: its scores and log-probs kept, its function idle again (or, dead,
        its groups ready again)."""
        p = self.calls.pop(ref)
        armed, p.armed = p.armed, False
        try:
            out = ray.get(ref)
        except LOST:
            self._lost(p, armed)
            return
        if armed:
            self.metrics["faults/prepare_injected"] += float(self.fault[1] > 0)
        if p.learner:
            self.functions.settle(p.lease, p.inv)
        begin = out["begin"] - out.get("load_s", 0.0)
        p.inv.mark_busy(begin, out["end"])
        if out.get("load_s"):
            ref_bytes = self.reference[1] if self.reference else 0
            same = p.inv.node == self.functions.driver
            self.meter.transfer(
                Transfer("reference", "learner", p.inv.name, ref_bytes, out["load_s"], same, begin)
            )
        for i, (key, score) in enumerate(zip(p.keys, out["scores"], strict=True)):
            self.scores[key] = score
            if out["ref"] is not None:
                self.ref[key] = out["ref"][i]
        self.metrics["time/reward"] += out["time/reward"]
        self.metrics["time/reference"] += out["end"] - out["begin"] - out["time/reward"]
        groups = len({uid for uid, _ in p.keys})
        self.spans.append({"function": p.inv.name, "begin": begin, "end": out["end"], "groups": groups})
        p.keys = []
        if not p.learner:
            self.idle.append(p)

    def scored(self) -> list[str]:
        """Groups whose every sample is scored (and has its reference log-probs, with a KL)."""
        group, with_ref = self.cfg.algorithm.group_size, self.reference is not None
        return [
            uid
            for uid, done in self.finished.items()
            if len(done) == group
            and all((uid, k) in self.scores and (not with_ref or (uid, k) in self.ref) for k in done)
        ]

    def group(self, uid: str) -> tuple[list[Sample], list[Tensor] | None]:
        """A scored group's samples, rewards set, in sample order, and their reference log-probs;
        built (decoded) once, as it is asked for at every decode report until it is learned."""
        if uid not in self.groups:
            samples = self._samples([uid])
            self.groups[uid] = samples, self._scored(samples)
        return self.groups[uid]

    def _scored(self, samples: list[Sample]) -> list[Tensor] | None:
        """Each sample's score set in place; their reference log-probs (None without a reference)."""
        for s in samples:
            s.reward, s.reward_components = self.scores[s.key]
        if self.reference is None:
            return None
        return [torch.from_numpy(np.array(self.ref[s.key])) for s in samples]

    def end_generation(self, now: float) -> None:
        self.generation_end = now

    # ----- after generation ----------------------------------------------------------------

    def finish(self, samples: list[Sample]) -> tuple[list[Tensor] | None, dict]:
        """What is left, on the prepare function; then every sample scored in place, and the
        reference log-probs in `samples`' order (None without a reference), and the metrics."""
        while True:
            idle, self.idle = self.idle, []
            for p in idle:  # generation is over: the learner's slot takes what is left
                self._release(p)
            if self.ready and self._prepare_fn_idle():
                self._send(self._prepare_fn(), self._take())
            if not self.calls:
                break
            ready, _ = ray.wait(list(self.calls), num_returns=1)
            self.absorb(ready[0])
        if self.prepare_fn is not None:
            p = self.prepare_fn
            self.functions.settle(p.lease, p.inv)
            end = time.time()
            p.inv.released = end
            self.functions.release(p.lease, end)
        return self._scored(samples), self.metrics | self._overlapped()

    def timeline(self, origin: float) -> dict:
        """The step's preparation calls, seconds from the step start, and when generation ended."""
        rel = lambda t: round(t - origin, 4)  # noqa: E731
        end = self.generation_end
        return {
            "generation_end": None if end is None else rel(end),
            "calls": [
                {
                    "function": s["function"],
                    "start": rel(s["begin"]),
                    "end": rel(s["end"]),
                    "groups": s["groups"],
                    "overlapped": end is not None and s["begin"] < end,
                }
                for s in self.spans
            ],
        }

    def _overlapped(self) -> dict[str, float]:
        """Preparation seconds (summed over functions) run before generation ended, and its groups."""
        end = self.generation_end or 0.0
        early = [s for s in self.spans if s["begin"] < end]
        return {
            "time/prep_overlapped": sum(min(s["end"], end) - s["begin"] for s in early),
            "prep/overlapped_groups": float(sum(s["groups"] for s in early)),
        }

    # ----- calls ---------------------------------------------------------------------------

    def _take(self, n: int | None = None) -> list[str]:
        """The first `n` ready groups (all: None)."""
        n = len(self.ready) if n is None else n
        uids, self.ready = self.ready[:n], self.ready[n:]
        return uids

    def _prepare_fn_idle(self) -> bool:
        p = self.prepare_fn
        return p is None or p not in self.calls.values()

    def _prepare_fn_started(self) -> bool:
        """The prepare function is warm: leased, its cold start over, or idle in the pool."""
        p = self.prepare_fn
        if p is None:
            shape = ("prepare", True, self.functions.driver)
            return any(lease.shape == shape for lease in self.functions.pool.idle)
        return p.lease.hello is None or bool(ray.wait([p.lease.hello], timeout=0)[0])

    def _prepare_fn(self) -> Worker:
        """The learner's prepare function, leased once a step (again after it died)."""
        if self.prepare_fn is not None:
            return self.prepare_fn
        if self.started == PREPARE_ATTEMPTS:
            raise RuntimeError(
                f"step {self.step}: {PREPARE_ATTEMPTS} prepare functions died; expected Ray to keep one alive"
            )
        self.started += 1
        driver = self.functions.driver
        lease, inv = self.functions.acquire(
            self.meter, self.kind, "prepare", True, driver, 0.0, time.time(), self.kind
        )
        if self.reference is not None and lease.version is None:
            lease.handle.sync.remote(self.reference[0], 0)
            lease.version = 0
        self.prepare_fn = Worker(lease, inv, True)
        return self.prepare_fn

    def _samples(self, uids: list[str]) -> list[Sample]:
        """The finished samples of groups `uids`, decoded, in sample order."""
        results = [self.finished[uid][s] for uid in uids for s in sorted(self.finished[uid])]
        return decoded(results, self.tokenizer)

    def _send(self, p: Worker, uids: list[str]) -> None:
        samples = self._samples(uids)
        prompts = [self.prompts[uid] for uid in uids]
        p.keys = [s.key for s in samples]
        if p.learner:
            p.armed, self.fault_due = self.fault_due, False
            ref = p.lease.handle.run.remote(prompts, samples, *(self.fault if p.armed else (False, 0.0)))
        else:
            if p.inv is None:  # its slot, held on past its decoding: billed as a function of its own
                d, now = p.decoded, time.time()
                name, resources = f"{self.kind}-{d.name}", dict(d.resources)
                inv = Invocation(name, self.kind, resources, d.units, now, now, now, node=d.node)
                p.inv = self.meter.open(inv)
            flat = None if self.reference is None else self.reference[0]
            ref = p.lease.handle.prepare.remote(flat, self.setup, prompts, samples)
            if flat is not None:  # it holds the reference now: the policy's weights again before it decodes
                p.lease.version = None
        p.inv.event(time.time(), "prepare", len(uids))
        self.calls[ref] = p

    def _release(self, p: Worker) -> None:
        """A decode function's slot, its preparing done: released as the plan said."""
        now = time.time()
        if p.inv is not None:
            p.inv.released = now
        self.functions.release(p.lease, now, keep=p.keep_warm)

    def _lost(self, p: Worker, armed: bool) -> None:
        """Its function died: its groups are ready again, for another preparer."""
        now = time.time()
        self.ready = sorted({uid for uid, _ in p.keys}) + self.ready
        if p.learner:
            self.functions.settle(p.lease, p.inv)
            self.prepare_fn = None
        p.inv.released = now
        p.inv.event(now, "fault", len(p.keys))
        self.functions.drop(p.lease)
        self.metrics["faults/prepare"] += 1
        if armed:
            self.metrics["faults/prepare_injected"] += float(self.fault[1] > 0) + float(self.fault[0])
        p.keys = []
