"""What every Ray function of a run finds in its environment before torch makes its first tensor.

PyTorch backs a CPU tensor of 2 MB or more with transparent huge pages when `THP_MEM_ALLOC_ENABLE`
is set (c10's CPU allocator, read once, at the process's first allocation). Without it, every
large activation and gradient a learner's update frees goes back to the kernel and is
page-faulted afresh, 4 KB at a time, by the next: about a million faults an update of the default
model, 1.9 s of system time. With it, 0.15x the faults and 0.46x the system time, and the update
took 0.91x the time (`benchmarks/bench_huge_pages.py`; docs/DECISIONS.md, "Huge pages for the Ray
functions' tensors"). It changes where tensors live, never what they hold; the kernel decides in
the end (THP mode `always` or `madvise`). The driver is left as it is: with it set there too, the
driver's and the decode function's resident memory each grew by 0.5 GB in the default run (pages
they share), against the 4 GB goal. Set `THP_MEM_ALLOC_ENABLE=0` to opt out; a value already set
is kept.
"""

from __future__ import annotations

from collections.abc import MutableMapping

HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
DEFAULTS = {HUGE_PAGES: "1"}


def set_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Fill in `DEFAULTS` where `environ` does not set them; returns those filled in. A Ray cluster
    the run joins must be handed these (`ray_cluster.start_ray`); a value that was set already is
    the user's, and reaches the functions as their other settings do (the nodes' environment, or
    the job's runtime_env, which Ray will not let a driver set again)."""
    added = {key: value for key, value in DEFAULTS.items() if key not in environ}
    environ.update(added)
    return added
