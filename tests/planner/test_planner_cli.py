"""`rlhfless plan`: a summary for a person or the whole plan as JSON for a prompts file, one clear
line and exit 2 for bad input."""

import json

from rlhfless.cli import main


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"uid": f"q{i}", "prompt_tokens": [5, 6, 7, i], "history": [[20 * i + 5, 10]], "answer_tokens": 30}
    for i in range(6)
]


def test_plan_prints_the_step_plan_as_json(tmp_path, capsys):
    argv = ["plan", "--prompts", str(write(tmp_path / "p.jsonl", ROWS)), "scheduler.n_max=3", "--nodes", "1"]
    code = main([*argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert "not measured" in out["profile"]
    assert 1 <= out["n_actors"] <= 3 and len(out["actors"]) == out["n_actors"]
    assert sorted(u for a in out["actors"] for u in a["uids"]) == sorted(r["uid"] for r in ROWS)
    assert {"n", "time", "cost", "score"} <= set(out["candidates"][0])
    assert out["prefix_length"] >= 3 and out["plan_seconds"] > 0


def test_plan_summarises_the_same_plan_for_a_person(tmp_path, capsys):
    argv = ["plan", "--prompts", str(write(tmp_path / "p.jsonl", ROWS)), "scheduler.n_max=3", "--nodes", "1"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("plan: 6 prompts x 4 samples, policy rlhfless")
    n, floor = plan["n_actors"], plan["floor"]
    assert f"actors        {n} decode actor(s)" in text and "chosen by lam 0.7" in text
    assert f"floor {floor['time_s']:.2f} s" in text
    assert f"{plan['predicted_time'] / floor['time_s']:.2f}x" in text
    chosen = [line for line in text.splitlines() if line.startswith("*")]
    assert len(chosen) == 1 and chosen[0].split()[1] == str(n)
    # one line per actor, each with its prompt count: together every prompt
    actor_lines = text.split("--json lists every uid)\n")[1].splitlines()[1:]
    assert len(actor_lines) == n and sum(int(line.split()[3]) for line in actor_lines) == len(ROWS)


def test_a_budget_the_plan_keeps_is_named_as_its_reason(tmp_path, capsys):
    path = write(tmp_path / "p.jsonl", ROWS)
    assert main(["plan", "--prompts", str(path), "--nodes", "1", "--json"]) == 0
    cheapest = min(c["cost"] for c in json.loads(capsys.readouterr().out)["candidates"])
    budget = f"{cheapest * 1.5:.6g}"
    assert main(["plan", "--prompts", str(path), "--nodes", "1", f"scheduler.budget_per_step={budget}"]) == 0
    assert f"chosen by budget_per_step {float(budget):g}" in capsys.readouterr().out


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


def test_plan_weighs_every_decode_size_and_names_the_one_it_took(tmp_path, capsys):
    path = str(write(tmp_path / "p.jsonl", ROWS))
    cluster = ["--model", "llama-2-70b", "--gpu", "h100", "--nodes", "2", "scheduler.gpus_per_actor=8"]
    assert main(["plan", "--prompts", path, *cluster, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    sizes = [o["gpus"] for o in plan["shape_options"]]
    assert sizes[:2] == [4, 8]  # 70B leaves TP 2 too little KV; then a split between them, if any
    assert all(o["pools"][0][0] == 8 and o["pools"][1][0] == 4 for o in plan["shape_options"][2:])
    taken = {a["gpus"] for a in plan["actors"]}
    assert taken in ({4}, {8}, {4, 8}) and f"on {max(taken)} x h100" in plan["profile"]
    assert main(["plan", "--prompts", path, *cluster]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " TP " in line]
    assert len(lines) == len(sizes) and sum("* TP" in line for line in lines) == 1
    assert main(["plan", "--prompts", path, *cluster, "--decode-tp", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape_options"] == []


def test_a_decode_size_list_that_is_not_integers_or_not_the_tables_is_one_line(tmp_path, capsys):
    path = str(write(tmp_path / "p.jsonl", ROWS))
    assert main(["plan", "--prompts", path, "--decode-tp", "4,x"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "rlhfless plan: --decode-tp: got '4,x', expected comma-separated integers >= 1"
    )
    table = tmp_path / "t.json"
    assert main(["profile", "--simulated", "model=qwen2.5-3b", "gpu=l40s", "--json"]) == 0
    table.write_text(capsys.readouterr().out)
    assert main(["plan", "--prompts", path, "--profile", str(table), "--decode-tp", "1,2"]) == 2
    assert "--decode-tp: got '1,2', expected only the measured table's size (1)" in capsys.readouterr().err


def test_a_split_plan_says_so_and_a_deadline_only_a_split_meets_is_met(tmp_path, capsys):
    rows = [
        {
            "uid": f"u{i}",
            "prompt_tokens": [1] * 20 + [i + 2] * 100,
            "history": [3000, 2800] if i == 0 else [500, 450],
        }
        for i in range(512)
    ]
    path = str(write(tmp_path / "p.jsonl", rows))
    cluster = ["--model", "llama-2-70b", "--gpu", "h100", "--nodes", "4", "scheduler.gpus_per_actor=8"]
    assert main(["plan", "--prompts", path, *cluster, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {a["gpus"] for a in plan["actors"]} == {4, 8}  # lam took a split
    singles = [o["step_time"] for o in plan["shape_options"] if "pools" not in o]
    deadline = 0.5 * (plan["predicted_step_time"] + min(singles))
    assert main(["plan", "--prompts", path, *cluster]) == 0
    assert "a split between two sizes, chosen by lam 0.7" in capsys.readouterr().out
    assert main(["plan", "--prompts", path, *cluster, f"scheduler.deadline_per_step={deadline}"]) == 0
    assert "a split between two sizes, chosen by deadline_per_step" in capsys.readouterr().out
