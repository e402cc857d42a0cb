"""Fault recovery of one step's generation: a decode function that dies (or whose node does), or
that Ray does not place within `runtime.place_timeout_s`, has its unfinished sequences re-run
elsewhere from their last reported state.

A mixin of `DecodeRound` (the state it reads and writes is the round's); kept in a room of its own
so that the round reads as assign, advance, cut and migrate.
"""

from __future__ import annotations

import pickle
import time
from typing import TYPE_CHECKING

import ray

from rlhfless.engine.sequences import SequenceState
from rlhfless.runtime.transfer import Transfer

if TYPE_CHECKING:
    from rlhfless.runtime.decode_round import Run

RERUNS_PER_ACTOR = 4  # replacement functions a step may start per planned one before it gives up


class Recovery:
    """`DecodeRound`'s recovery from lost and unplaced functions."""

    def _placement_wait(self) -> float | None:
        """Seconds until the first not-yet-placed function's placement deadline (None: none waits)."""
        waiting = [r.inv.requested for r in self.runs if not r.done and not r.placed]
        if not waiting:
            return None
        return max(0.0, min(waiting) + self.rt.place_timeout_s - time.time())

    def _replace_unplaced(self) -> None:
        """Functions Ray has not placed by their deadline: stopped, their sequences placed again."""
        now = time.time()
        for run in [r for r in self.runs if not r.done and not r.placed]:
            if now < run.inv.requested + self.rt.place_timeout_s:
                continue
            if self.functions.placed(run.lease):
                run.placed = True  # placed, its cold start still running: wait on it
                continue
            self.inflight = {ref: r for ref, r in self.inflight.items() if r is not run}
            self.metrics["faults/unplaced"] += 1
            self._lost(run, "unplaced")

    def _lost(self, dead: Run, why: str = "fault") -> None:
        """A function is gone: its node's other functions too when the node died; every unfinished
        sequence of theirs re-runs elsewhere from its last reported state."""
        gone = [dead]
        if why == "fault" and not dead.colocated and not _alive(dead.node):
            gone += [r for r in self.runs if r.node == dead.node and not r.done and r is not dead]
            self.inflight = {ref: r for ref, r in self.inflight.items() if r not in gone}
        for run in gone:
            self._recover(run, why)

    def _recover(self, dead: Run, why: str) -> None:
        now = time.time()
        self.functions.drop(dead.lease)
        if dead.lease in self.held:
            self.held.remove(dead.lease)
        dead.done = True
        dead.inv.released = now
        lost = sorted(dead.pending())
        dead.inv.event(now, why, len(lost))
        exits = [f for f in dead.faults if f.kind != "slow"]
        if exits:  # it died of an injected fault (the first that could fire)
            dead.inv.event(now, f"injected:{exits[0].kind}", 1)
            self.metrics["faults/injected"] += 1
            dead.faults = []
        dead.assigned -= set(lost)
        self.metrics["faults"] += 1
        self.metrics["faults/rerun_sequences"] += len(lost)
        if not lost:
            return
        states = []
        for uid, sample in lost:
            live = self.last.get((uid, sample))
            generated, logprobs = (live.generated, live.logprobs) if live else ([], [])
            self.metrics["faults/resumed_tokens"] += len(generated)
            states.append(SequenceState(uid, sample, self.prompts[uid].prompt_ids, generated, logprobs))
        target, new = self._rerun_target(dead, len(lost))
        target.lease.handle.resume.remote(states, self.params, self.step)
        self._moved_in(target, lost, now)
        if new:  # its first slice starts after the resume: its report counts them
            target.incoming = 0
        self.meter.transfer(
            Transfer(
                "rerun",
                "learner",
                target.name,
                len(pickle.dumps(states)),
                0.0,
                target.node == self.view.driver,
                now,
            )
        )
        if new:
            self._advance(target)

    def _rerun_target(self, dead: Run, n: int) -> tuple[Run, bool]:
        """A live function with room for `n` sequences; else a new one on a node Ray has a free
        slot on now; else the live one with the most room; else a new one on the learner's slot."""
        alive = [r for r in self.runs if not r.done]
        roomy = [r for r in alive if r.free_slots >= n]
        if roomy:
            return max(roomy, key=lambda r: r.free_slots), False
        node = next(
            (
                v.node_id
                for v in self.view.nodes
                if _alive(v.node_id) and self.functions.free_slots(v.node_id)
            ),
            None,
        )
        if node is None and alive:
            return max(alive, key=lambda r: r.free_slots), False
        index = max(r.index for r in self.runs) + 1
        if index > RERUNS_PER_ACTOR * (len(self.plan.actors) + 1):
            raise RuntimeError(
                f"step {self.step}: {index - len(self.plan.actors)} replacement decode functions died "
                f"too; expected Ray to keep one alive (is its node reachable?)"
            )
        run = self._open(
            index, f"decode-{dead.index}-rerun", node is None, node or self.view.driver, dead.inv.units
        )
        run.keep_warm = dead.keep_warm
        run.free_slots = self.cfg.generation.max_running
        return run, True


def _alive(node: str) -> bool:
    return any(n["NodeID"] == node and n["Alive"] for n in ray.nodes())
