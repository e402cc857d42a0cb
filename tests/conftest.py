"""Suite-wide: no test leaves a Ray process behind.

Other users run Ray on the same machine, so a process is ours only if this pytest process started
it: every descendant seen after a test is remembered (with its start time, so a reused pid is not
mistaken for it), and so is every Ray session directory named on their command lines, which also
finds a Ray process whose parent died and left it to init. At the end of the session none of them
may be alive; Ray's own shutdown is asynchronous, so they get a grace period to exit.
"""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest

GRACE_S = 30.0
# The files that take longest (most start many Ray functions, each importing for seconds) run
# first, longest first: `make test`'s two workers take whole files in collection order, so that
# short files fill both workers at the end. xdist's own order (most tests first) left the long
# few-test files last, one worker running them alone. Collection order alone left the longest file
# outside the Ray ones (`test_validation.py`, 80-110 s) near the end: the suite took 666-670 s on
# session 60's machine, and 620-627 s with the next-longest files listed here too and that file's
# Ray test a step shorter (the two workers' last tests then ended 8 s apart).
LONGEST_FIRST = (
    "tests/runtime/test_ray_executor.py",
    "tests/runtime/test_dp_learner.py",
    "tests/runtime/test_multinode.py",
    "tests/train/test_validation.py",
    "tests/runtime/test_job_submit.py",
    "tests/forecast/test_forecast.py",
    "tests/sim/test_profile_command.py",
    "tests/report/test_report_page.py",
    "tests/inputs/test_bad_inputs.py",
    "tests/reliability/test_faults.py",
)
SESSION_DIR = re.compile(r"/ray/session_[\w.-]+")

_started: dict[int, float] = {}  # pid -> create time of each process this session started
_sessions: set[str] = set()  # Ray session directories those processes belong to


def _note_descendants() -> None:
    for p in psutil.Process().children(recursive=True):
        try:
            _started[p.pid] = p.create_time()
            _sessions.update(SESSION_DIR.findall(" ".join(p.cmdline())))
        except psutil.Error:
            pass


def _left_behind() -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "create_time", "cmdline"]):
        try:
            cmdline = " ".join(p.info["cmdline"] or [])
            ours = _started.get(p.info["pid"]) == p.info["create_time"]
            if ours and "ray" not in cmdline.lower():
                continue  # not a Ray process
            if ours or any(s in cmdline for s in _sessions):
                out.append(f"pid {p.info['pid']}: {cmdline[:160]}")
        except psutil.Error:
            pass
    return out


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: k for k, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


@pytest.fixture(autouse=True)
def _remember_started_processes():
    yield
    _note_descendants()


@pytest.fixture(scope="session", autouse=True)
def no_ray_process_left_behind():
    yield
    _note_descendants()
    deadline = time.monotonic() + GRACE_S
    while (left := _left_behind()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "Ray processes started by this test session outlived it:\n" + "\n".join(left)


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory):
    """Converted weights, profiles and the time model earlier runs leave go to this pytest run's
    own cache (`RLHFLESS_CACHE`), one for all its xdist workers as on a clean CI machine: a test's
    plan must not depend on what earlier test runs left in ~/.cache."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is in the run's shared one
        root = root.parent
    cache = root / "rlhfless-cache"
    cache.mkdir(exist_ok=True)
    os.environ["RLHFLESS_CACHE"] = str(cache)
