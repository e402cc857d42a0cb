"""Run files, reports and simulator outputs are written whole or not at all (`rlhfless.files`)."""

import os
import stat

import pytest

from rlhfless import files
from rlhfless.files import write_atomic


def test_text_and_bytes_land_whole_in_a_folder_made_for_them(tmp_path):
    text, png = tmp_path / "run" / "summary.json", tmp_path / "run" / "figure.png"
    write_atomic(text, "café\n")
    write_atomic(png, b"\x89PNG\r\n")
    assert text.read_bytes() == "café\n".encode()
    assert png.read_bytes() == b"\x89PNG\r\n"
    assert sorted(p.name for p in text.parent.iterdir()) == ["figure.png", "summary.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    write_atomic(target, "old\n")

    def torn(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", torn)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_a_file_written_whole_takes_the_mode_a_plain_open_gives(tmp_path, mask):
    """mkstemp makes its file owner-only; a run's files are read by a team (TensorBoard, reports)."""
    old = os.umask(mask)
    try:
        write_atomic(tmp_path / "report.html", "<html>")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == stat.S_IMODE(
        (tmp_path / "plain.txt").stat().st_mode
    )
