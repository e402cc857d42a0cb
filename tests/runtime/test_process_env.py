"""Every Ray function of a run starts with torch's huge pages for large tensors, unless the user says not."""

import os

import pytest
import ray

from rlhfless.runtime import ray_cluster
from rlhfless.runtime.process_env import HUGE_PAGES, set_defaults
from rlhfless.runtime_config import RuntimeConfig


def test_defaults_fill_in_only_what_the_environment_does_not_set():
    environ = {"PATH": "/bin"}
    assert set_defaults(environ) == {HUGE_PAGES: "1"}
    assert environ == {"PATH": "/bin", HUGE_PAGES: "1"}
    opted_out = {HUGE_PAGES: "0"}
    assert set_defaults(opted_out) == {} and opted_out == {HUGE_PAGES: "0"}


@pytest.mark.parametrize("user,handed", [(None, {"env_vars": {HUGE_PAGES: "1"}}), ("0", None)])
def test_a_cluster_the_run_joins_is_handed_the_defaults_it_filled_in(monkeypatch, user, handed):
    """A value the user set reaches the cluster as their other settings do: a submitted job's own
    runtime_env may hold it, and Ray refuses a driver that sets one of its keys again."""
    monkeypatch.setenv(HUGE_PAGES, user or "")  # so that the test's end restores what was there
    if user is None:
        monkeypatch.delenv(HUGE_PAGES)
    calls = []
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.ray, "init", lambda **kwargs: calls.append(kwargs))
    assert ray_cluster.start_ray(RuntimeConfig(ray_address="10.0.0.9:6379"))
    assert calls[0]["runtime_env"] == handed
    assert os.environ[HUGE_PAGES] == (user or "1")


def test_every_function_of_an_embedded_ray_inherits_them(monkeypatch):
    monkeypatch.setenv(HUGE_PAGES, "")  # so that the test's end restores what was there
    monkeypatch.delenv(HUGE_PAGES)
    assert ray_cluster.start_ray(RuntimeConfig(num_cpus=2))
    try:
        assert ray.get(ray.remote(lambda: os.environ.get(HUGE_PAGES)).remote()) == "1"
    finally:
        ray.shutdown()
