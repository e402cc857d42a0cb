"""Peak resident memory of this process and of the processes it started (an embedded Ray's raylet
and its workers, the Ray functions), per process kind and per phase, sampled by a thread.

A Ray worker's kind is the title Ray gives its process (`ray::DecodeFunction.advance` ->
`DecodeFunction`); an idle pooled worker is `IDLE`; Ray's own daemons go by their program name
(`raylet`, `gcs_server`). Only descendants are sampled, so other Ray clusters on the machine are
not. Resident memory (RSS) counts shared pages too (libraries, object-store pages a process has
touched); `private` is RSS less those shared pages, what the process alone holds.

    with MemorySampler() as mem:
        mem.phase = "generate"
        ...
    print(mem.table())
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass

import psutil

GB = 1e9


@dataclass
class Peak:
    """The largest resident memory one process of a kind reached, and its private part then."""

    rss: int = 0
    private: int = 0
    pid: int = 0


def process_kind(proc: psutil.Process, driver_pid: int) -> tuple[str, bool]:
    """`driver` for this process; the Ray function class for a Ray worker; else the program name;
    and whether Ray titled it (`ray::...`)."""
    if proc.pid == driver_pid:
        return "driver", False
    cmdline = proc.cmdline()
    first = cmdline[0] if cmdline else proc.name()
    if first.startswith("ray::"):
        return first[len("ray::") :].split(".")[0].split("(")[0].split(" ")[0] or "ray-worker", True
    if "default_worker.py" in " ".join(cmdline):
        return "ray-worker-starting", False
    program = os.path.basename(first).split(" ")[0]
    scripts = [arg for arg in cmdline[1:] if not arg.startswith("-")]
    if program.startswith("python") and scripts:  # a Ray daemon written in Python
        return os.path.basename(scripts[0]).removesuffix(".py"), False
    return program, False


class MemorySampler:
    """Samples every `period_s`; `peaks[(kind, phase)]` and `overall[kind]` hold the per-process
    peaks, `total_peak` the largest sum over every sampled process at one instant."""

    def __init__(self, period_s: float = 0.1, series: bool = False) -> None:
        """`series`: also keep every sample in `self.series`, (seconds since start, phase, process
        title, pid, RSS, private): when, and in which method (`ray::LearnerRank.learn`), a kind peaks."""
        self.period_s = period_s
        self.series: list[tuple[float, str, str, int, int, int]] | None = [] if series else None
        self.start = time.perf_counter()
        self.phase = "start"
        self.driver = psutil.Process()
        self.peaks: dict[tuple[str, str], Peak] = {}
        self.overall: dict[str, Peak] = {}
        self.total_peak = 0
        self.samples = 0
        self.ray_functions: set[str] = set()  # kinds titled `ray::` by Ray, IDLE and agents aside
        self._kinds: dict[int, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.is_set():
            self.sample()
            time.sleep(self.period_s)

    def sample(self) -> None:
        """One sample of every live process of the tree."""
        try:
            procs = [self.driver, *self.driver.children(recursive=True)]
        except psutil.Error:
            return
        total, phase = 0, self.phase
        for proc in procs:
            try:
                info = proc.memory_info()
                kind, titled = process_kind(proc, self.driver.pid)
            except psutil.Error:  # it ended between the listing and the read
                continue
            if not info.rss:  # a zombie, or a process mid-exec
                continue
            if kind.startswith("ray-worker"):  # not titled yet: keep a known title of this pid
                kind = self._kinds.get(proc.pid, kind)
            else:
                self._kinds[proc.pid] = kind
            if (
                kind not in ("driver", "IDLE")
                and not kind.endswith("Agent")
                and proc.name().startswith("ray::")
            ):
                self.ray_functions.add(kind)
            private = info.rss - getattr(info, "shared", 0)
            total += info.rss
            if self.series is not None:
                now = time.perf_counter() - self.start
                try:
                    title = proc.cmdline()[0] if kind != "driver" else kind
                except (psutil.Error, IndexError):
                    title = kind
                self.series.append((round(now, 3), phase, title, proc.pid, info.rss, private))
            for peaks, key in ((self.peaks, (kind, phase)), (self.overall, kind)):
                peak = peaks.setdefault(key, Peak())
                if info.rss > peak.rss:
                    peak.rss, peak.private, peak.pid = info.rss, private, proc.pid
        self.total_peak = max(self.total_peak, total)
        self.samples += 1

    def to_dict(self) -> dict:
        phases: dict[str, dict[str, dict]] = {}
        for (kind, phase), peak in sorted(self.peaks.items()):
            phases.setdefault(kind, {})[phase] = asdict(peak)
        return {
            "period_s": self.period_s,
            "samples": self.samples,
            "total_peak_rss": self.total_peak,
            "ray_functions": sorted(self.ray_functions),
            "overall": {kind: asdict(peak) for kind, peak in sorted(self.overall.items())},
            "by_phase": phases,
        }


def memory_table(result: dict, title: str) -> str:
    """Peak RSS (and private) in GB per process kind, then per kind and phase."""
    lines = [
        f"{title}: peak resident memory per process ({result['samples']} samples, every {result['period_s']} s)"
    ]
    lines.append(f"  {'process kind':28s} {'peak RSS GB':>12s} {'private GB':>11s}   by phase (RSS GB)")
    for kind, peak in result["overall"].items():
        phases = ", ".join(f"{p} {v['rss'] / GB:.2f}" for p, v in result["by_phase"].get(kind, {}).items())
        lines.append(f"  {kind:28s} {peak['rss'] / GB:12.2f} {peak['private'] / GB:11.2f}   {phases}")
    lines.append(f"  {'all processes at once':28s} {result['total_peak_rss'] / GB:12.2f}")
    return "\n".join(lines)
