"""`rlhfless profile --simulated` prints the derived table without touching torch."""

import json
import subprocess
import sys

from rlhfless.cli import main
from rlhfless.planner.profile import Profile

SCRIPT = """
import json, sys
from rlhfless.commands import profile
import argparse
parser = argparse.ArgumentParser(); sub = parser.add_subparsers(dest="command")
profile.add_parser(sub)
rc = profile.run(parser.parse_args(sys.argv[1:]))
print(json.dumps({"rc": rc, "torch": "torch" in sys.modules}))
"""


def run_profile(*argv):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "profile", *argv], capture_output=True, text=True, check=True
    )
    *body, status = done.stdout.strip().splitlines()
    return json.loads(status), "\n".join(body), done.stderr.strip()


def test_simulated_json_is_the_issue_format_and_does_not_import_torch():
    status, body, _ = run_profile("--simulated", "gpu=h100", "model=llama-2-70b", "tp=8", "--json")
    assert status == {"rc": 0, "torch": False}
    table = json.loads(body)
    assert set(table) >= {"decode", "prefill"} and table["gpus"] == 8
    assert table["note"] == "roofline: llama-2-70b on 8 x h100"  # read back, not taken for measured
    assert set(table["decode"][0]) == {"batch", "context", "ms"} and set(table["prefill"][0]) == {
        "tokens",
        "ms",
    }
    decode = {(row["batch"], row["context"]): row["ms"] for row in table["decode"]}
    assert decode[(128, 4096)] > decode[(1, 1)] > 0


def test_unknown_key_is_an_error_naming_it():
    status, body, err = run_profile("--simulated", "gpus=8")
    assert status["rc"] == 2 and not body and "gpus" in err


def test_a_value_of_the_wrong_kind_is_one_line_naming_its_key(capsys):
    for argv, line in (
        (("--simulated", "tp=abc"), "rlhfless profile: tp: got 'abc', expected an integer"),
        (("model.path=tiny", "batches=1,x"), "rlhfless profile: batches: got 'x', expected an integer"),
        (
            ("model.path=tiny", "model.tiny_layers=2.5"),
            "rlhfless profile: model.tiny_layers: got '2.5', expected an integer",
        ),
        (
            ("model.path=tiny", "kv_budget_gb=abc"),
            "rlhfless profile: kv_budget_gb: got 'abc', expected a number",
        ),
        (
            ("model.path=tiny", "kv_budget_gb=0"),
            "rlhfless profile: kv_budget_gb: got '0', expected a positive number of GiB",
        ),
    ):
        assert main(["profile", *argv]) == 2
        out, err = capsys.readouterr()
        assert (out, err.strip()) == ("", line)


def test_measured_table_of_the_tiny_model_is_a_profile_the_planner_reads(tmp_path):
    out = tmp_path / "profile.json"
    status, body, _ = run_profile(
        "model.path=tiny",
        "batches=1,2",
        "contexts=1,8",
        "prefill_tokens=1,8",
        "repeats=1",
        "--json",
        "--output",
        str(out),
    )
    assert status["rc"] == 0
    profile = Profile.load(out)
    assert profile.decode_batch.tolist() == [1, 2] and profile.decode_context.tolist() == [1, 8]
    assert profile.prefill_tokens.tolist() == [1, 8] and profile.gpus == 1
    assert profile.cold_start_s > 0  # a fresh interpreter's imports and the model's load
    assert json.loads(body) == json.loads(out.read_text())


def test_measured_unknown_key_is_an_error_naming_it():
    status, body, err = run_profile("model.path=tiny", "model.colour=red")
    assert status["rc"] == 2 and not body and "colour" in err


def test_a_kv_budget_names_the_points_it_extended_instead_of_timing():
    status, body, _ = run_profile(
        "model.path=tiny",
        "batches=1,4",
        "contexts=1,8,200",
        "prefill_tokens=8",
        "repeats=1",
        "kv_budget_gb=0.000001",  # about 1 KB: past the first two contexts, every point is over
    )
    assert status["rc"] == 0
    assert "decode points extended, not timed (kv_budget_gb): 1x200, 4x200" in body
