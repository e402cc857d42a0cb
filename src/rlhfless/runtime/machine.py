"""What this machine is to the planner: its time table (`runtime.profile`, else measured once and
cached by model shape, dtype and threads, and scaled to the machine's speed as the run starts), its
actor slots as a cluster, and where the run memory (the time model earlier runs learned here) is
kept."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from rlhfless.config import Config
from rlhfless.engine.packed import PackedLinears
from rlhfless.models import model_shape
from rlhfless.planner import ClusterSpec, Profile
from rlhfless.planner.hardware import GpuSpec, ModelShape, roofline_profile
from rlhfless.planner.learning import learner_width
from rlhfless.runtime_config import RuntimeConfig

# A 2-core CPU slot as an "accelerator" for the derived profile (`runtime.profile=derived`): rough
# peak figures (AVX2 FP32 on two cores, one DDR channel's share), far from what the engine does.
CPU_SLOT = GpuSpec(
    "cpu-slot",
    bf16_tflops=0.1,
    memory_gb=24,
    memory_tbps=0.02,
    link_gbps=10.0,
    inter_node_gbps=1.0,
    price_per_hour=0.1,
)
DERIVED = "derived"
# The measured grid: decode batches up to the engine's running limit, contexts up to the longest
# prompt + response a default run sees; the planner extrapolates linearly past the last point.
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (1, 128, 256, 512, 1024)
PREFILL = (16, 64, 256, 1024)
# The decode points the speed probe times, points of the measured grid: 1, 4 and 16 sequences at
# 128 tokens. One table point is a noisy reference: the step at 4 x 128 of SmolLM2-135M on one
# core took 77-141 ms here, minutes and processes apart, and a table cached beside two CPU-bound
# processes held it 2.2x slow where its forecast came out only 1.1x long. The median of the
# points' ratios is taken; a warm-up and 5 timed steps of each take about 2 s.
PROBE_BATCHES, PROBE_CONTEXT, PROBE_REPEATS = (1, 4, 16), 128, 5
# The most KV one timed decode point may hold: a machine's first run measures its profile in the
# driver, which the default run keeps under 4 GB (the grid's largest point: 3.0 GB of KV).
PROFILE_KV_BYTES = 1 << 30


def cache_key(model: torch.nn.Module, threads: int, packed: bool = False) -> str:
    """What a measured time depends on: the model's config, dtype and device, threads, torch, the
    machine, and whether the engine's linear weights are reordered (`generation.packed_weights`,
    where it applies)."""
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    param = next(model.parameters())
    device = "" if param.device.type == "cpu" else f"|{torch.cuda.get_device_name(param.device)}"
    raw = f"{config}|{param.dtype}|{threads}|{torch.__version__}|{os.cpu_count()}{device}"
    if packed and PackedLinears(model).active:
        raw += "|packed"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def function_start_s() -> float:
    """A function's cold start as this machine can time one before a run has started any: a
    fresh interpreter importing what a decode function imports (5.1-7.3 s on the 2-core machine
    here, where a decode function's start measured 4.0-7.4 s and a learner rank's 5.2-7.5 s). Its
    weights' load is left out. Without it a run's first plans priced every start at 0 s. 0.0
    where the import fails (the run then measures its starts as before)."""
    begin = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "import rlhfless.runtime.functions"], capture_output=True, check=False
    )
    return time.perf_counter() - begin if done.returncode == 0 else 0.0


@dataclass(frozen=True)
class Speed:
    """This machine now against its cached time table: the probe's decode steps as the table has
    them (`table_ms`) and as timed when the run started (`now_ms`). A shared host's speed drifts
    by the hour (the planner's own benchmark 1.6x slower from one session to the next here, with
    0-55% of the CPU stolen by the host), and a table measured once would carry the hour it was
    measured in into every forecast: whole-run forecasts made so came out 46% short and 51% long
    in different hours of the same machine."""

    table_ms: tuple[float, ...]
    now_ms: tuple[float, ...]

    @property
    def factor(self) -> float:
        """How many times slower the machine is now than its table (below 1: faster)."""
        return self.since(self.table_ms)

    def since(self, then: Sequence[float] | None) -> float:
        """How many times slower the machine is now than when the probe's steps took `then` ms:
        the median of the points' ratios (1 where `then` is not this probe's, or untimed)."""
        before, now = np.asarray(then, dtype=float), np.asarray(self.now_ms)
        timed = before > 0
        if before.shape != now.shape or not timed.any():
            return 1.0
        return float(np.median(now[timed] / before[timed]))


def _timed(model: torch.nn.Module, threads: int, **grid) -> dict:
    """`measure_profile` of `grid` with `threads` torch threads."""
    from rlhfless.engine.profiling import measure_profile

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return measure_profile(model, **grid)
    finally:
        torch.set_num_threads(before)


def probe(model: torch.nn.Module, threads: int, packed: bool = False) -> tuple[float, ...]:
    """The probe's decode steps, timed now as the table timed them (each the median of
    `PROBE_REPEATS` after a warm-up), in ms."""
    table = _timed(
        model,
        threads,
        batches=PROBE_BATCHES,
        contexts=(PROBE_CONTEXT,),
        prefill_tokens=(),
        repeats=PROBE_REPEATS,
        packed_weights=packed,
    )
    return tuple(float(point["ms"]) for point in table["decode"])


def _table_ms(profile: Profile) -> tuple[float, ...]:
    """The probe's decode steps as `profile` has them, in ms."""
    return tuple(1000.0 * float(profile.decode_step_seconds(b, PROBE_CONTEXT)) for b in PROBE_BATCHES)


def at_speed(profile: Profile, factor: float) -> Profile:
    """`profile` on a machine `factor` times slower: its prefill and decode steps and a function's
    cold start (imports and loads run on the same CPUs)."""
    if factor == 1.0:
        return profile
    return replace(
        profile,
        prefill_ms=profile.prefill_ms * factor,
        decode_ms=profile.decode_ms * factor,
        cold_start_s=profile.cold_start_s * factor,
    )


def measured_profile(
    model: torch.nn.Module, cache_dir: str, threads: int, packed: bool = False, probing: bool = True
) -> tuple[Profile, Speed]:
    """This engine's time table on this machine with `threads` torch threads (`packed`: its linear
    weights reordered, as the decode functions run them), and a function's cold start
    (`function_start_s`), measured once and cached under `cache_dir/profiles/` (`cache_key`). A
    cached table is scaled to the machine's speed now (`probing`: by the probe's timing; else as
    cached), and the speed is returned with it."""
    path = Path(cache_dir).expanduser() / "profiles" / f"{cache_key(model, threads, packed)}.json"
    if path.is_file():
        try:
            cached = Profile.load(path)
            if not cached.cold_start_s:  # cached before starts were measured
                cached = replace(cached, cold_start_s=function_start_s())
                cached.save(path)
            table_ms = _table_ms(cached)
            speed = Speed(table_ms, probe(model, threads, packed) if probing else table_ms)
            return at_speed(cached, speed.factor), speed
        except (ValueError, OSError, json.JSONDecodeError):
            pass  # a damaged cache entry is measured again
    table = _timed(
        model,
        threads,
        batches=BATCHES,
        contexts=CONTEXTS,
        prefill_tokens=PREFILL,
        repeats=2,
        packed_weights=packed,
        kv_budget_bytes=PROFILE_KV_BYTES,
    )
    table["note"] = f"measured on this machine with {threads} thread(s)" + extended_note(table["extended"])
    table["cold_start_s"] = function_start_s()
    profile = Profile.from_dict(table)
    profile.save(path)
    table_ms = _table_ms(profile)
    return profile, Speed(table_ms, table_ms)


def extended_note(extended: list[dict]) -> str:
    """What a profile's note says of the decode points it did not time (`measure_profile`)."""
    if not extended:
        return ""
    points = ", ".join(f"{p['batch']}x{p['context']}" for p in extended)
    return f"; decode points over the KV budget, extended along their batch's line: {points}"


def machine_profile(cfg: Config, model: torch.nn.Module) -> tuple[Profile, Speed | None]:
    """The table the run names (`runtime.profile`: a file, or `derived` from the model's shape;
    no speed: nothing here measured it), else this machine's, measured once with a decode
    function's threads and scaled to its speed now (`runtime.speed_probe`)."""
    path = cfg.runtime.profile
    if path == DERIVED:
        return roofline_profile(model_shape(model), CPU_SLOT), None
    if path:
        return Profile.load(path), None
    return measured_profile(
        model,
        cfg.model.cache_dir,
        cfg.runtime.threads_per_actor,
        cfg.generation.packed_weights,
        cfg.runtime.speed_probe,
    )


def machine_cluster(runtime: RuntimeConfig, gpus_per_actor: int, shape: ModelShape) -> ClusterSpec:
    """One node with the executor's actor slots; transfers sized by the model's weights and KV."""
    return ClusterSpec(
        nodes=1,
        gpus_per_node=runtime.slots() * gpus_per_actor,
        model_bytes=shape.weight_bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token,
    )


def memory_path(cfg: Config, policy: torch.nn.Module) -> Path | None:
    """Where earlier runs' time model is kept (None: `runtime.calibration_memory=false`): a file per
    model, thread count, executor, profile, learning width and scheduling policy. The phases after
    generation are learned as seconds a token at the width they ran on, which does not carry to
    another: a run at `runtime.learner_width=1` forecast with two ranks' rate came out 14-22%
    short. A policy's functions share the machine differently (verl's ranks are resident and its
    decode functions run beside each other), so one policy's waits and scales misled the other's
    forecasts: verl's was 15.5% long after an rlhfless run."""
    if not cfg.runtime.calibration_memory:
        return None
    key = (
        f"{cache_key(policy, learner_threads(cfg), cfg.generation.packed_weights)}-{cfg.runtime.executor}-"
        f"{cfg.runtime.profile or 'measured'}-width{learning_width(cfg)}-{cfg.scheduler.policy}"
    )
    name = f"calibration-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    return Path(cfg.model.cache_dir).expanduser() / "profiles" / name


def learner_threads(cfg: Config) -> int:
    """Torch threads the run's learner works with: `trainer.threads` where set, else a CPU slot's
    (`runtime.threads_per_actor`) under the Ray executor on a CPU, else torch's default. Read from
    the config, not from the process: `train` built its planner before the Ray executor set the
    driver's threads, `plan --run` after, so the forecast before a run keyed the run memory by
    another thread count and never read what `train` had learned (session 54). The Ray executor
    sets the driver's threads by it too."""
    if cfg.trainer.threads:
        return cfg.trainer.threads
    if cfg.runtime.executor == "ray" and cfg.runtime.device != "cuda":
        return cfg.runtime.threads_per_actor
    return torch.get_num_threads()


def learning_width(cfg: Config) -> int:
    """Slots the learning phase is expected to hold: the planner's width with every slot free."""
    return learner_width(cfg.runtime.learner_width, cfg.runtime.slots(), cfg.data.batch_size)
