"""Recorded run directories for the report tests, written once per session (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_fake_run import write_fake_run

from rlhfless.report import write_report


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def tiny_run(runs_root: Path) -> Path:
    """A GRPO run with engine, runtime and planner: every documented file and key."""
    return write_fake_run(runs_root / "tiny", steps=3)


@pytest.fixture(scope="session")
def tiny_page(tiny_run: Path) -> Path:
    return write_report([tiny_run])


@pytest.fixture(scope="session")
def pair_page(runs_root: Path) -> Path:
    """`verl` (static actors, no planner) against `rlhfless`: same seed, so the same samples."""
    verl = write_fake_run(runs_root / "verl", steps=3, planner=False)
    rlhfless = write_fake_run(runs_root / "rlhfless", steps=3)
    return write_report([verl, rlhfless], runs_root / "compare" / "page.html")
