"""A function started ahead of its first use: how long it has been starting, and its whole start
once it is up, which the planner learns to price the run's first step with."""

import time
from types import SimpleNamespace

import pytest
import ray

from rlhfless.runtime.pool import FunctionPool

HOST = ("decode", True, "driver")


@ray.remote(num_cpus=0)
class Starting:
    """A function whose start takes `seconds` past its process's."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def where(self) -> str:
        return "node"

    def hello(self) -> SimpleNamespace:
        time.sleep(self.seconds)
        return SimpleNamespace(ready=time.time())


def test_a_prestarted_function_says_how_long_it_has_been_starting_and_then_its_whole_start(local_ray):
    pool = FunctionPool(lambda shape: Starting.remote(1.0), keep_alive_s=300.0)
    assert pool.starting_s(HOST, time.time()) == 0.0  # none: a whole start ahead
    begun = time.time()
    pool.prestart(HOST, begun)
    assert pool.starting_s(HOST, begun + 0.5) == pytest.approx(0.5)  # its start takes over 1 s
    ready = ray.get(pool.idle[0].hello).ready
    assert pool.starting_s(HOST, time.time()) is None  # started
    lease = pool.acquire(HOST, time.time())
    assert not lease.cold
    assert pool.prestart_s == {"decode": pytest.approx(ready - begun)} and ready - begun >= 1.0
    assert pool.starting_s(HOST, time.time()) is None  # in use
    pool.release(lease, time.time())
    pool.prestart_s.clear()
    assert pool.acquire(HOST, time.time()) is lease and pool.prestart_s == {}  # measured once
    pool.close()
