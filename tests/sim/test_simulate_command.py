"""`rlhfless simulate` writes the summary, per-step lines and figures, and prints the paper side by side."""

import json

import pytest

from rlhfless.commands import simulate
from rlhfless.sim.presets import preset


def run(argv, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    simulate.add_parser(parser.add_subparsers(dest="command"))
    rc = simulate.run(parser.parse_args(["simulate", *argv]))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_preset_run_writes_summary_steps_and_figures(tmp_path, capsys):
    small = [
        "training.steps=2",
        "training.sweep_steps=1",
        "workload.prompts_per_step=32",
        "workload.dataset_size=64",
    ]
    rc, out = run(["--preset", "paper-physical", "--output", str(tmp_path), *small], capsys)
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    first = summary["scenarios"]["grpo-qwen2.5-3b-gsm8k"]
    assert set(first) == {"verl", "+dedup", "+assignment", "rlhfless", "rlhfuse"}
    assert first["verl"]["speedup"] == 1.0 and "cost_reduction" in first["rlhfless"]
    assert len(summary["scenarios"]) == len(preset("paper-physical")) == 12
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 2 * (5 + 11 * 2)
    for figure in (
        "ablation",
        "assignment_vs_rlhfuse",
        "sweep_tau",
        "sweep_lam",
        "sweep_ewma_window",
        "sweep_noise",
        "sweep_actors",
        "scalability",
    ):
        assert (tmp_path / f"{figure}.png").stat().st_size > 1000
    assert "paper, best case (reported)" in out and "1.35x" in out and "(simulated)" in out


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.gpus=3", "gpus"),
        ("model.name=llama-3-8b", "model.name: got 'llama-3-8b'"),  # was "model.model"
        ("cluster.inter_node_gbps=abc", "cluster.inter_node_gbps: got 'abc'"),  # not "cluster:"
    ],
)
def test_bad_override_is_reported_with_its_key(tmp_path, capsys, override, key):
    rc, out = run([override, "--no-sweeps", "--output", str(tmp_path)], capsys)
    assert rc == 2 and key in out


def test_show_config_prints_each_scenarios_config_that_loads_back(tmp_path, capsys):
    import yaml

    from rlhfless.sim.config import build

    rc, out = run(["--preset", "paper-sim", "cluster.nodes=3", "--show-config"], capsys)
    assert rc == 0
    docs = out.split("---\n")
    assert len(docs) == len(preset("paper-sim"))
    for (name, tree), doc in zip(preset("paper-sim"), docs, strict=True):
        assert doc.startswith(f"# scenario {name}\n")
        shown = build(yaml.safe_load(doc))
        assert shown == build({**tree, "cluster": {**tree.get("cluster", {}), "nodes": 3}})
