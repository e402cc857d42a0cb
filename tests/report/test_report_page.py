"""The report page: self-contained, every figure inlined, and honest about what a run did not record."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from report_fake_run import write_fake_run
from report_html import PageParts

from rlhfless.cli import main
from rlhfless.report import write_report
from rlhfless.report.figures import function_labels
from rlhfless.report.rundir import load_run

SECTIONS = [
    "Runs",
    "Comparison",
    "Training curves",
    "Cost and time per step",
    "Step timeline",
    "Phase breakdown per step",
    "Response lengths and the length predictor",
    "Forecast against actual",
    "Generation over its floor",
    "Scaling decisions",
]
PNG = b"\x89PNG\r\n\x1a\n"


def _parts(page: Path) -> PageParts:
    return PageParts(page.read_text(encoding="utf-8"))


def _figure_names(page: Path) -> list[str]:
    return sorted(p.name for p in page.parent.glob(f"{page.stem}-*.png"))


def test_tiny_run_page_has_every_section_and_figure_inlined(tiny_run: Path, tiny_page: Path) -> None:
    assert tiny_page == tiny_run / "report.html"
    parts = _parts(tiny_page)
    assert parts.headings == SECTIONS
    assert parts.notes == []
    names = ["cost-time", "curves", "forecast", "lengths", "phases", "scaling-0", "timeline-0"]
    assert _figure_names(tiny_page) == [f"report-{n}.png" for n in names]
    assert len(parts.images) == len(names)
    beside = {(tiny_page.parent / n).read_bytes() for n in _figure_names(tiny_page)}
    inlined = set()
    for image in parts.images:
        prefix = "data:image/png;base64,"
        assert image["src"].startswith(prefix)
        data = base64.b64decode(image["src"][len(prefix) :])
        assert data.startswith(PNG)
        inlined.add(data)
        assert image["alt"]
    assert inlined == beside


def test_page_needs_nothing_from_outside(tiny_page: Path) -> None:
    parts = _parts(tiny_page)
    assert all(link.startswith("#") for link in parts.links)
    text = tiny_page.read_text(encoding="utf-8")
    assert "<script" not in text and "<link" not in text and "url(" not in text


def test_page_shows_candidate_table_with_chosen_row_and_predictor_figures(tiny_page: Path) -> None:
    text = tiny_page.read_text(encoding="utf-8")
    assert '<tr class="chosen">' in text
    assert "predicted within 50 tokens of the actual group max; Kendall tau" in text
    for row in ("<td>planner</td>", "<td>KV transfer</td>", "<td>generation: decode</td>"):
        assert row in text  # phase table
    assert "<td>idle</td>" not in text and "<td>billed</td>" not in text
    assert "<th>transfer hidden</th>" in text
    assert "<th>within verl&#x27;s cap</th>" in text and "<td>yes</td>" in text  # the plans record it
    assert "; verl's cap " in text
    assert "tiny: transfers over 3 recorded step(s)" in text and "<td>across nodes</td>" in text


def test_two_run_comparison(pair_page: Path) -> None:
    parts = _parts(pair_page)
    assert parts.headings == SECTIONS
    assert _figure_names(pair_page) == [
        f"page-{n}.png"
        for n in [
            "cost-time",
            "curves",
            "forecast",
            "lengths",
            "phases",
            "scaling-1",
            "timeline-0",
            "timeline-1",
        ]
    ]
    assert len(parts.images) == 8
    text = pair_page.read_text(encoding="utf-8")
    assert "RLHFless report: verl vs rlhfless" in text
    assert "identical (72 samples)" in text
    assert "verl: no plans/step_*.json files (no planner in this run)" in parts.notes
    assert "verl: rollouts carry no `predicted_length` (no planner in this run)" in parts.notes


def test_forecast_section_scores_each_forecast_and_puts_the_whole_run_beside_its_outcome(tiny_page) -> None:
    text = tiny_page.read_text(encoding="utf-8")
    # The fake run's forecasts are 10% high, 30% low, 5% low and 5% high: 3 of 4 within 20%.
    rows = PageParts(text).tables
    scores = {r[1]: r[3:] for table in rows for r in table if r and r[0] == "tiny" and len(r) == 5}
    assert scores["generation time (s)"] == ["100%", "10.0%"]
    assert scores["generation cost ($)"] == ["0%", "30.0%"]
    assert scores["step cost ($)"] == ["100%", "5.0%"]
    whole = {r[1]: r[5] for table in rows for r in table if r and r[0] == "tiny" and r[1] in ("time", "cost")}
    assert whole == {"time": "+20.0%", "cost": "-10.0%"}
    # The length pilot ran before step 1, outside every step's figures: the report says what it cost.
    pilot = "tiny: the length pilot before step 1 sampled 5 prompt(s) and took 12.5 s, $0.0068 of the learner"
    assert pilot in text


def test_floor_section_puts_each_run_s_generation_over_its_floor(tiny_page) -> None:
    rows = PageParts(tiny_page.read_text(encoding="utf-8")).tables
    floor = [
        r for table in rows for r in table if r and r[0] == "tiny" and len(r) == 7 and r[3].endswith("x")
    ]
    # The fake run: floor half its time, a quarter its cost; every unique prompt token computed
    # once; a quarter second of preparation in the tail.
    assert [r[3:] for r in floor] == [["2.00x", "4.00x", "1.00", "250 ms"]]


def test_in_process_executor_run_says_what_is_missing(tmp_path: Path) -> None:
    run = write_fake_run(tmp_path / "local", steps=2, runtime=False, planner=False, engine=False)
    page = write_report([run])
    notes = _parts(page).notes
    assert "local: no `cost/step` in metrics.jsonl (cost is billed only by the serverless runtime)" in notes
    assert "local: no timeline/step_*.json files (the in-process executor records no timeline)" in notes
    assert "local: no plans/step_*.json files (no planner in this run)" in notes
    assert (
        "local: not recorded: planner time (`time/plan` or plan files), `time/weight_sync`, `time/kv_transfer`"
        in notes
    )
    assert _figure_names(page) == [f"report-{n}.png" for n in ["cost-time", "curves", "lengths", "phases"]]


def test_damaged_run_still_gets_a_page_listing_the_damage(tmp_path: Path) -> None:
    run = write_fake_run(tmp_path / "broken", steps=3)
    metrics = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(metrics[: len(metrics) // 2])
    (run / "timeline" / "step_000003.json").write_text('{"step": 3, "functions": [{"name": "lea')
    for file in (run / "rollouts").iterdir():
        file.unlink()
    (run / "config.yaml").unlink()
    page = write_report([run], tmp_path / "out" / "broken.html")
    text = page.read_text(encoding="utf-8")
    parts = _parts(page)
    assert parts.headings == SECTIONS
    assert "timeline/step_000003.json is not valid JSON" in text
    assert "metrics.jsonl line 2 is not valid JSON" in text
    assert "broken: no rollouts/step_*.jsonl files" in parts.notes
    assert "broken: no config.yaml" in parts.notes
    assert "broken-timeline-0.png" in _figure_names(page)


def test_directory_without_any_recorded_file(tmp_path: Path) -> None:
    page = write_report([tmp_path], tmp_path / "empty.html")
    parts = _parts(page)
    assert parts.headings == SECTIONS
    assert parts.images == []
    assert f"{tmp_path.name}: no `time/step` in metrics.jsonl" in parts.notes
    assert "no metrics.jsonl" in page.read_text(encoding="utf-8")


def test_cli_writes_the_page_where_asked_and_prints_its_path(tiny_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "sub" / "r.html"
    assert main(["report", str(tiny_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.is_file() and (tmp_path / "sub" / "r-curves.png").is_file()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "expected a run directory" in capsys.readouterr().err


def test_report_library_imports_neither_torch_nor_ray() -> None:
    code = (
        "import sys, rlhfless.report; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'transformers'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_runs_with_different_steps_and_odd_names(tmp_path: Path) -> None:
    short = write_fake_run(tmp_path / "cost $^$ <fast>", steps=1, prompts=2, samples=2)
    long = write_fake_run(tmp_path / "cost $6_x", steps=2, prompts=2, samples=2)
    page = write_report([short, long])
    parts = _parts(page)
    assert "the runs recorded different steps: each mean is over that run's own steps" in parts.notes
    assert "RLHFless report: cost $^$ &lt;fast&gt; vs cost $6_x" in page.read_text(encoding="utf-8")
    assert len(parts.images) == 9


def test_the_timeline_shows_each_functions_node_and_every_transfer_inside_or_across_nodes(
    tmp_path: Path,
) -> None:
    run = write_fake_run(tmp_path / "two-nodes", steps=1, prompts=2, samples=2)
    driver, worker = "d" * 56, "w" * 56
    timeline = {
        "step": 1,
        "nodes": [
            {"node": driver, "address": "10.0.0.1", "slots": 2, "free": 2, "driver": True},
            {"node": worker, "address": "10.0.0.2", "slots": 1, "free": 1, "driver": False},
        ],
        "functions": [
            {"name": name, "kind": kind, "started": 0.0, "released": 2.0, "node": node}
            for name, kind, node in (
                ("learner", "learner", driver),
                ("decode-0", "decode", driver),
                ("decode-1", "decode", worker),
                ("decode-2", "decode", "lost" * 14),  # on a node the plan did not list
            )
        ],
        "transfers": [
            {
                "kind": "weights",
                "source": "learner",
                "target": "decode-1",
                "bytes": 3e6,
                "seconds": 0.5,
                "same_node": False,
                "start": 0.1,
            },
            {
                "kind": "weights",
                "source": "learner",
                "target": "decode-0",
                "bytes": 3e6,
                "seconds": 0.001,
                "same_node": True,
                "start": 0.1,
            },
            {
                "kind": "kv",
                "source": "prefill",
                "target": "decode-1",
                "bytes": 2048,
                "seconds": 0.25,
                "same_node": False,
                "start": 0.2,
            },
            {
                "kind": "weights",
                "source": "learner",
                "target": "decode-2",
                "bytes": 3e6,
                "seconds": 1.5,
                "same_node": False,
                "start": 0.1,
            },
        ],
    }
    (run / "timeline" / "step_000001.json").write_text(json.dumps(timeline))
    page = write_report([run])
    tables = [[row for row in t if row] for t in _parts(page).tables]  # body rows only
    [nodes] = [t for t in tables if t[0][1] == "n0 (driver)"]
    [transfers] = [t for t in tables if t[0][0] == "weights"]
    assert nodes == [
        ["1", "n0 (driver)", "dddddddddddd", "10.0.0.1", "2 of 2", "learner, decode-0"],
        ["1", "n1", "wwwwwwwwwwww", "10.0.0.2", "1 of 1", "decode-1"],
        ["1", "lostlost", "lostlostlost", "n/a", "n/a", "decode-2"],
    ]
    assert transfers == [
        ["weights", "within a node", "1", "3 MB", "1 ms"],
        ["weights", "across nodes", "2", "6 MB", "2.00 s"],
        ["kv", "across nodes", "1", "2.05 kB", "250 ms"],
    ]
    labels = function_labels(load_run(run).timelines[1], load_run(run).timelines[1].functions)
    assert labels == ["learner @ n0", "decode-0 @ n0", "decode-1 @ n1", "decode-2 @ lostlost"]


def test_a_timeline_recorded_before_nodes_were_gets_a_note_not_a_table(tmp_path: Path) -> None:
    run = write_fake_run(tmp_path / "old", steps=1, prompts=2, samples=2)
    file = run / "timeline" / "step_000001.json"
    timeline = json.loads(file.read_text())
    for key in ("nodes", "transfers"):
        del timeline[key]
    for f in timeline["functions"]:
        del f["node"]
    file.write_text(json.dumps(timeline))
    page = write_report([run])
    assert _parts(page).notes == ["old: timelines record no nodes (recorded since multi-node placement)"]
    assert "report-timeline-0.png" in _figure_names(page)


def test_the_forecast_figure_crosses_the_deadline_at_each_step_that_took_the_nearest_plan(
    tmp_path: Path,
) -> None:
    from rlhfless.report.figures import forecast

    run_dir = write_fake_run(tmp_path / "tiny", steps=3)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row, missed in zip(rows, (1.0, 0.0, 1.0), strict=True):
        row |= {"target/deadline_per_step": 9.5, "target/missed": missed}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    axes = {ax.get_title(): ax for ax in forecast([load_run(run_dir)]).axes}
    crosses = [line for line in axes["step time (s)"].get_lines() if line.get_label() == "tiny missed"]
    assert [list(c.get_xdata()) for c in crosses] == [[1, 3]]
    assert [list(c.get_ydata()) for c in crosses] == [[9.5, 9.5]]
    assert not [line for line in axes["step cost ($)"].get_lines() if "missed" in line.get_label()]


def test_a_validated_run_shows_its_held_out_reward_from_first_to_last(tmp_path: Path) -> None:
    run = write_fake_run(tmp_path / "validated", steps=3)
    rows = [
        {"step": 0, "val/reward/mean": 0.125, "val/source/a": 0.25, "val/source/b": 0.0},
        {"step": 3, "val/reward/mean": 0.5, "val/source/a": 0.75, "val/source/b": 0.25},
    ]
    (run / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert {s: v["val/reward/mean"] for s, v in load_run(run).validations.items()} == {0: 0.125, 3: 0.5}
    tables = _parts(write_report([run])).tables
    assert tables[0][-1][-1] == "0.125 (step 0) to 0.5 (step 3)"
    per_source = [t for t in tables if t and t[-1][1:2] == ["b"]][0]
    assert [row for row in per_source if row] == [
        ["validated", "a", "0.25 (step 0)", "0.75 (step 3)"],
        ["validated", "b", "0 (step 0)", "0.25 (step 3)"],
    ]


def test_a_run_without_validation_says_so_in_the_runs_table(tiny_page: Path) -> None:
    assert _parts(tiny_page).tables[0][-1][-1] == "-"
