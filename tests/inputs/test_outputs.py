"""An output path that cannot be made is one line, exit 2, before a command loads or computes
anything (it was a traceback, after the work): `inputs.check_writable`."""

import pytest

from rlhfless.cli import main


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["simulate", "--preset", "paper-physical", "--no-sweeps", "--output", "{bad}"], "--output"),
        (["profile", "--simulated", "--output", "{bad}"], "--output"),
        (["export", "{run}", "{bad}"], "OUT_DIR"),
        (["report", "{run}", "--out", "{bad}"], "--out"),
        (["train", "--preset", "tiny", "output_dir={bad}"], "output_dir"),
    ],
)
def test_an_output_under_a_file_is_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    (tmp_path / "file").write_text("x")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: r\n")
    bad = tmp_path / "file" / "out"
    assert main([a.format(bad=bad, run=run) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}: {bad}: {tmp_path / 'file'} is a file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]  # nothing made
