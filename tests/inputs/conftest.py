"""One real tiny run, trained once per session, that the bad-input tests copy and then damage."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlhfless.cli import main

FAST = ("trainer.progress=false", "trainer.report=false", "trainer.tensorboard=false")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step `tiny` run with its checkpoint (never modified: copy it with `run_copy`)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "--preset", "tiny", f"output_dir={out}", "trainer.steps=1", *FAST]) == 0
    return out


@pytest.fixture
def run_copy(trained_run: Path, tmp_path: Path) -> Path:
    """A private copy of the trained run, to damage."""
    target = tmp_path / "run"
    shutil.copytree(trained_run, target)
    return target
