"""`rlhfless plan`: JSON out for a prompts file, one clear line and exit 2 for bad input."""

import json

from rlhfless.cli import main


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plan_prints_the_step_plan(tmp_path, capsys):
    rows = [
        {"uid": f"q{i}", "prompt_tokens": [5, 6, 7, i], "history": [[20 * i + 5, 10]], "answer_tokens": 30}
        for i in range(6)
    ]
    code = main(
        ["plan", "--prompts", str(write(tmp_path / "p.jsonl", rows)), "scheduler.n_max=3", "--nodes", "1"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert "not measured" in out["profile"]
    assert 1 <= out["n_actors"] <= 3 and len(out["actors"]) == out["n_actors"]
    assert sorted(u for a in out["actors"] for u in a["uids"]) == sorted(r["uid"] for r in rows)
    assert {"n", "time", "cost", "score"} <= set(out["candidates"][0])
    assert out["prefix_length"] >= 3 and out["plan_seconds"] > 0


def test_bad_row_names_file_row_and_field(tmp_path, capsys):
    path = write(
        tmp_path / "p.jsonl", [{"uid": "a", "prompt_tokens": [1]}, {"uid": "b", "prompt_tokens": "x"}]
    )
    assert main(["plan", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{path}:2: prompt_tokens" in err


def test_bad_override_exits_2(tmp_path, capsys):
    path = write(tmp_path / "p.jsonl", [{"uid": "a", "prompt_tokens": [1]}])
    assert main(["plan", "--prompts", str(path), "scheduler.tau=2"]) == 2
    assert "scheduler.tau: got 2" in capsys.readouterr().err
