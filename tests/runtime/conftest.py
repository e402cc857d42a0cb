"""One embedded Ray per module for the runtime tests that need a plain local Ray.

Module scope, not session: test_multinode and test_job_submit start clusters of their own and
need no Ray connected when they begin, and may run in the same pytest process right after a
module that uses this (`LONGEST_FIRST` in tests/conftest.py).
"""

import pytest
import ray


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of one CPU on 127.0.0.1 (with the driver's learner slot, two actor slots)."""
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    yield
    ray.shutdown()
