"""Running the real CLI in-process and checking a refusal's shape: exit 2, one line, nothing changed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rlhfless.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (relative path -> sha1), to show a refusal wrote and lost nothing."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def refused(capsys: pytest.CaptureFixture, argv: list[str], *needles: str) -> str:
    """Run `rlhfless argv`; assert exit code 2 and one stderr line holding every needle; return it."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, f"exit code {code}, stderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err}"
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]
