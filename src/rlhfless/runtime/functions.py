"""The serverless functions a step runs on Ray: decode actors and the reference/reward function.

Plain classes, wrapped with `ray.remote(...).options(...)` by the pool, so their resources come
from the plan. Creating one is its cold start (process, imports, model from storage); the weights
of the current policy version then arrive as one flat buffer from the object store. A decode
function works in time slices (`advance`), each ending with a progress report: finished results,
counts, and the partial state of every unfinished sequence, which is what the controller re-runs
elsewhere if this function dies before the next report.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import numpy as np
import psutil
import ray
import torch

from rlhfless.config import ModelConfig
from rlhfless.data.gym import import_gym
from rlhfless.engine.engine import Engine
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import EngineStats, Request, SequenceResult, SequenceState
from rlhfless.faults import DecodeFault
from rlhfless.models import load_model
from rlhfless.rewards import RewardConfig, build_reward_fn
from rlhfless.runtime.executor import score
from rlhfless.runtime.logprobs import response_logprobs
from rlhfless.runtime.micro_batch import pack
from rlhfless.runtime.precision import autocast
from rlhfless.runtime.samples import Sample, StepPrompt
from rlhfless.runtime.transfer import KVBundle, from_numpy, load_flat_weights

# (uid, prompt ids, sample indices, its prefix tree node in the step's KV bundle or None)
Work = tuple[str, list[int], list[int], int | None]


@dataclass
class LiveSequence:
    """The partial state of an unfinished sequence, as last reported (no KV: re-prefilled on resume)."""

    uid: str
    sample: int
    generated: list[int]
    logprobs: list[float]


@dataclass
class Report:
    """What a decode function says at the end of a time slice."""

    results: list[SequenceResult]
    live: list[LiveSequence]
    free_slots: int
    begin: float
    end: float
    stats: EngineStats
    iterations: int
    fired: list[str]  # kinds of the injected faults that fired in this slice and were survived


@dataclass
class Started:
    """A function's cold start: when its process began work and when it could serve, and where."""

    started: float
    ready: float
    pid: int
    host: str
    node: str  # the Ray node it runs on, as Ray reports it to the function itself


def live_sequences(engine: Engine) -> list[LiveSequence]:
    """Running and queued sequences of `engine` (left in it): what a fault re-run resumes from."""
    return [LiveSequence(s.uid, s.sample, s.generated_ids, s.logprobs) for s in engine.unfinished()]


def started(begin: float, ready: float) -> Started:
    """The cold start's span and where it ran; a function built outside Ray (tests, the GPU check)
    names no node rather than starting a Ray of its own to ask."""
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return Started(begin, ready, os.getpid(), socket.gethostname(), node)


def function_setup(threads: int) -> float:
    """Set the thread count; returns when this process was created (its imports are cold start too)."""
    torch.set_num_threads(threads)
    return psutil.Process().create_time()


class DecodeFunction:
    """A decode actor: one engine on one copy of the policy."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        vocab_size: int,
        seed: int,
        eos_token_ids: list[int],
        pad_token_id: int,
        max_running: int,
        threads: int,
        device: str,
        cuda_graphs: bool = False,
        packed_weights: bool = False,
        after: object = None,
    ) -> None:
        """Only the process: the model loads in `hello`, so that `where` answers as soon as Ray has
        placed the function, before its cold start ends. `after`: what Ray waited for before it
        created this function (`Functions.prestart`); not kept."""
        self.started = function_setup(threads)
        self.setup = (
            model_cfg,
            vocab_size,
            seed,
            eos_token_ids,
            pad_token_id,
            max_running,
            device,
            cuda_graphs,
            packed_weights,
        )
        self.params: SamplingParams | None = None
        self.step = 0
        self.faults: list[DecodeFault] = []
        self.iterations = 0
        self.preparer: Preparer | None = None  # built on its first `prepare`
        self.holds_reference = False  # its engine holds the reference's weights, not the policy's

    def where(self) -> str:
        """The Ray node this function was placed on."""
        return ray.get_runtime_context().get_node_id()

    def hello(self) -> Started:
        """The rest of the cold start, called once by the pool after `where`: the model from
        storage into an engine."""
        model_cfg, vocab_size, seed, eos_token_ids, pad_token_id, max_running, device, graphs, packed = (
            self.setup
        )
        model = load_model(model_cfg, vocab_size, seed, device)
        self.engine = Engine(
            model,
            eos_token_ids=eos_token_ids,
            pad_token_id=pad_token_id,
            weight_version=-1,
            max_running=max_running,
            cuda_graphs=graphs,
            packed_weights=packed,
        )
        return started(self.started, time.time())

    def sync(self, flat: np.ndarray, version: int) -> float:
        """Load policy weights `version` from the flat buffer; returns the seconds it took."""
        start = time.perf_counter()
        self.engine.set_weights(from_numpy(flat, next(self.engine.model.parameters()).dtype), version)
        self.holds_reference = False
        return time.perf_counter() - start

    def assign(
        self,
        work: list[Work],
        bundle: KVBundle | None,
        params: SamplingParams,
        step: int,
        faults: list[DecodeFault],
    ) -> float:
        """Queue this step's prompts, each from its prefix tree node's KV (the node's levels joined
        once per node); arm this step's injected faults (`runtime.faults`). Returns seconds spent."""
        start = time.perf_counter()
        self.params, self.step, self.faults, self.iterations = params, step, list(faults), 0
        nodes = {p for *_, p in work if p is not None}
        kv = {p: bundle.get(p) for p in sorted(nodes)} if bundle is not None else {}
        requests = [Request(uid, ids, len(samples), kv.get(p), samples) for uid, ids, samples, p in work]
        self.engine.add(requests, params, step)
        return time.perf_counter() - start

    def resume(self, states: list[SequenceState], params: SamplingParams, step: int) -> None:
        """Continue sequences started elsewhere (migrated in, or re-run after a fault)."""
        self.params, self.step = params, step
        self.engine.resume(states, params, step)

    def advance(self, seconds: float) -> Report:
        """Decode for about `seconds` (at least one iteration), then report."""
        begin = time.time()
        before = self.engine.snapshot_stats()
        progress = self.engine.progress()
        fired: list[str] = []
        while progress.running or progress.queued:
            self.engine.step()
            self.iterations += 1
            for fault in [f for f in self.faults if self.iterations >= f.after]:
                self.faults.remove(fault)
                fault.fire()  # an exit does not return: the process dies mid-step
                fired.append(fault.kind)
            progress = self.engine.progress()
            if time.time() - begin >= seconds:
                break
        return Report(
            self.engine.take_finished(),
            live_sequences(self.engine),
            progress.free_slots,
            begin,
            time.time(),
            self.engine.stats.minus(before),
            self.iterations,
            fired,
        )

    def cut(self, groups: list[list[tuple[str, int]]], with_kv: bool) -> list:
        """Hand over the sequences in `groups` (one list per target); keep the rest running here.

        Returns one list of states per group, then {"bytes": KV bytes handed over, per group}.
        """
        states = self.engine.cut(with_kv=with_kv)
        by_key = {(s.uid, s.sample): s for s in states}
        out = [[by_key.pop(key) for key in group if key in by_key] for group in groups]
        if by_key:
            self.engine.resume(list(by_key.values()), self.params, self.step)
        for group in out:  # KV travels through the object store from the CPU: any target can read it
            for s in group:
                s.kv = None if s.kv is None else s.kv.to("cpu")
        moved = [sum(s.kv.nbytes for s in group if s.kv is not None) for group in out]
        return [*out, {"bytes": moved}]

    def prepare(
        self,
        reference: np.ndarray | None,
        setup: PrepSetup,
        prompts: list[StepPrompt],
        samples: list[Sample],
    ) -> dict:
        """Prepare finished groups on this slot once its decoding is done: the reference's weights
        (None: the run has no reference) into its engine's model, unless they are there already
        (the driver re-syncs the policy before it decodes again), then `Preparer.run`. Adds
        `load_s`, the seconds the weights took."""
        start = time.time()
        if reference is not None and not self.holds_reference:
            self.engine.set_weights(from_numpy(reference, next(self.engine.model.parameters()).dtype), -1)
            self.holds_reference = True
        load_s = time.time() - start
        if self.preparer is None:
            self.preparer = Preparer(setup, str(self.engine.device))
        out = self.preparer.run(None if reference is None else self.engine.model, prompts, samples)
        return out | {"load_s": load_s}


@dataclass(frozen=True)
class PrepSetup:
    """What preparing samples needs besides them: the reward, and the reference forward's settings."""

    reward: RewardConfig
    temperature: float
    pad_token_id: int
    compute_dtype: str
    gym: bool = False  # the prompts are reasoning-gym's: the prepare function imports it as it starts


class Preparer:
    """Rewards and, given a reference model, its log-probs of finished samples: the prepare
    function's work, and a decode function's when it prepares in generation's tail.

    The reference runs one prompt group per forward pass, so a group's log-probs are the same bits
    whichever call, function or schedule computes them (in a micro-batch of several groups, their
    padding would move the last bits)."""

    def __init__(self, setup: PrepSetup, device: str) -> None:
        self.setup, self.device = setup, device
        self.reward_fn = build_reward_fn(setup.reward)

    def run(
        self, reference: torch.nn.Module | None, prompts: list[StepPrompt], samples: list[Sample]
    ) -> dict:
        """Scores per sample, reference log-probs per sample (or None), and phase seconds."""
        begin = time.time()
        score(prompts, samples, self.reward_fn)
        scores = [(s.reward, s.reward_components) for s in samples]
        rewards_s = time.time() - begin
        ref = None if reference is None else self._logprobs(reference, samples)
        return {"scores": scores, "ref": ref, "begin": begin, "end": time.time(), "time/reward": rewards_s}

    @torch.no_grad()
    def _logprobs(self, reference: torch.nn.Module, samples: list[Sample]) -> list[np.ndarray]:
        st = self.setup
        out: list[np.ndarray] = [np.zeros(0, dtype=np.float32)] * len(samples)
        rows = list(range(len(samples)))
        for mb in pack(samples, rows, 0, st.pad_token_id, self.device):  # budget 0: a group a pass
            with autocast(reference, st.compute_dtype):
                values = response_logprobs(reference, mb, st.temperature).cpu()
            for b, i in enumerate(mb.rows):
                out[i] = values[b, : len(samples[i].response_ids)].float().numpy()
        return out


class PrepareFunction:
    """Preparation on the learner's slot: rule-based rewards and, with a KL penalty, the frozen
    reference's log-probs."""

    def __init__(
        self,
        model_cfg: ModelConfig | None,
        vocab_size: int,
        seed: int,
        setup: PrepSetup,
        threads: int,
        device: str,
        after: object = None,
    ) -> None:
        """`after`: what Ray waited for before it created this function (`Functions.prestart`);
        not kept."""
        self.started = function_setup(threads)
        self.preparer = Preparer(setup, device)
        if setup.gym:  # in its start, not in step 1's scoring (a decode function's tail pays it there)
            import_gym()
        self.reference = None
        if model_cfg is not None:
            self.reference = load_model(model_cfg, vocab_size, seed, device).requires_grad_(False)
        self.ready = time.time()

    def where(self) -> str:
        """The Ray node this function was placed on (answered after its reference model loaded)."""
        return ray.get_runtime_context().get_node_id()

    def hello(self) -> Started:
        return started(self.started, self.ready)

    def sync(self, flat: np.ndarray, version: int) -> float:
        start = time.perf_counter()
        load_flat_weights(self.reference, flat)
        return time.perf_counter() - start

    def run(
        self, prompts: list[StepPrompt], samples: list[Sample], exit_first: bool = False, sleep_s: float = 0.0
    ) -> dict:
        """`Preparer.run` on the reference it holds; an injected fault (`runtime.faults`) first
        sleeps `sleep_s` or exits the process."""
        time.sleep(sleep_s)
        if exit_first:
            os._exit(1)
        return self.preparer.run(self.reference, prompts, samples)
