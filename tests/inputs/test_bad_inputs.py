"""The bad-input matrix (docs/BAD_INPUTS.md): every file the CLI reads, broken every way that applies.

Each case runs the real `rlhfless` entry point in-process and expects exit code 2, one stderr line
naming the file and the row or key, no traceback, and no change in the run directory.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import FAST
from inputs_support import refused, snapshot
from safetensors.torch import load_file, save_file

from rlhfless.cli import main

VERL_ROW = {
    "data_source": "t",
    "prompt": [{"role": "user", "content": "2+2?"}],
    "reward_model": {"ground_truth": "4"},
}
TRL_ROW = {"prompt": "2+2?", "solution": "4"}
PROFILE = {
    "decode": [{"batch": 1, "context": 1, "ms": 1.0}, {"batch": 1, "context": 64, "ms": 2.0}],
    "prefill": [{"tokens": 1, "ms": 1.0}, {"tokens": 64, "ms": 4.0}],
    "gpus": 1,
    "max_kv_tokens": 4096,
}
NOT_UTF8 = b"\xff\xfe not text"


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def placed(path: Path, content: str | bytes | None) -> Path:
    """`path` holding `content`, or left missing when it is None (the "missing" cases)."""
    return path if content is None else write(path, content)


def jsonl(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def train_argv(out: Path, *overrides: str) -> list[str]:
    return ["train", "--preset", "tiny", f"output_dir={out}", *FAST, *overrides]


# ----- YAML config: `rlhfless train CONFIG.yaml` ------------------------------------------------

YAML = {
    "missing": (None, ["not found", "expected a YAML config"]),
    "empty": ("\n", ["empty", "expected a YAML config"]),
    "wrong type": ("model: {path: tiny}\ntrainer: {steps: abc}\n", ["trainer.steps", "'abc'", "expected"]),
    "not a mapping": ("- a\n- b\n", ["got list, expected a YAML config (a mapping)"]),
    "unknown key": ("trainer: {stpes: 3}\n", ["unknown key 'trainer.stpes'", "did you mean"]),
    "null": ("model: null\n", ["model: got None", "expected a section"]),
    "non-UTF-8": (b"name: " + NOT_UTF8, ["byte 6 is not UTF-8", "expected UTF-8"]),
    "truncated": ("model: {path: tiny\n", ["not valid YAML"]),
    "huge": ("#" * (17 << 20), ["MB, expected a YAML config", "at most 16 MB"]),
}


@pytest.mark.parametrize("case", list(YAML))
def test_yaml_config(case, tmp_path, capsys):
    content, needles = YAML[case]
    path = placed(tmp_path / "cfg.yaml", content)
    out = tmp_path / "run"
    refused(capsys, ["train", str(path), f"output_dir={out}", *FAST], str(path), *needles)
    assert not out.exists()


# ----- data files: VERL and TRL layouts, JSONL and Parquet ----------------------------------------

TOO_LONG = "x" * 300  # byte-level tiny tokenizer: one token per byte, over max_prompt_tokens=128

DATA_JSONL = {
    "missing": (None, "verl", ["data file not found"]),
    "empty": ("", "verl", ["no rows, expected at least one prompt"]),
    "verl wrong type": (jsonl([VERL_ROW, {**VERL_ROW, "prompt": 5}]), "verl", ["row 2", "'prompt': got int"]),
    "verl missing column": (jsonl([{"prompt": "q"}]), "verl", ["row 1", "'reward_model': missing"]),
    "verl missing key": (
        jsonl([{"prompt": "q", "reward_model": {"style": "rule"}}]),
        "verl",
        ["row 1", "'reward_model.ground_truth': missing"],
    ),
    "verl null": (jsonl([{**VERL_ROW, "reward_model": None}]), "verl", ["row 1", "'reward_model': got None"]),
    "verl null prompt": (jsonl([{**VERL_ROW, "prompt": None}]), "verl", ["row 1", "'prompt': got null"]),
    "non-UTF-8": (jsonl([VERL_ROW]).encode() + NOT_UTF8 + b"\n", "verl", ["line 2: byte 0 is not UTF-8"]),
    "truncated": (jsonl([VERL_ROW]) + jsonl([VERL_ROW])[:30], "verl", ["row 2: invalid JSON", "truncated?"]),
    "not an object": (jsonl([VERL_ROW, [1, 2]]), "verl", ["row 2: got list", "expected an object"]),
    "verl over-long prompt": (
        jsonl([VERL_ROW, {**VERL_ROW, "prompt": TOO_LONG}]),
        "verl",
        ["row 2", "'prompt'", "max_prompt_tokens=128"],
    ),
    "trl missing column": (jsonl([{"question": "q"}]), "trl", ["row 1", "'prompt': missing"]),
    "trl wrong type": (jsonl([{"prompt": {"text": "q"}}]), "trl", ["row 1", "'prompt': got dict"]),
    "trl null": (jsonl([{"prompt": None}]), "trl", ["row 1", "'prompt': got null"]),
    "trl answer wrong type": (
        jsonl([{"prompt": "q", "solution": [4]}]),
        "trl",
        ["row 1", "'solution': got list"],
    ),
    "trl plain over-long prompt": (
        jsonl([TRL_ROW, {"prompt": TOO_LONG}]),
        "trl",
        ["row 2", "max_prompt_tokens"],
    ),
    "chat not a message": (jsonl([{"prompt": ["hi"]}]), "trl", ["row 1", "'prompt[0]': got str"]),
    "chat empty": (jsonl([{"prompt": []}]), "trl", ["row 1", "'prompt': got an empty list"]),
    "chat bad role": (
        jsonl([{"prompt": [{"role": "robot", "content": "q"}]}]),
        "trl",
        ["row 1", "'prompt[0].role': got 'robot'"],
    ),
    "chat null content": (
        jsonl([{"prompt": [{"role": "user", "content": None}]}]),
        "trl",
        ["row 1", "'prompt[0].content': got None"],
    ),
    "chat missing key": (jsonl([{"prompt": [{"role": "user"}]}]), "trl", ["row 1", "'prompt[0].content'"]),
    "chat over-long prompt": (
        jsonl([{"prompt": [{"role": "user", "content": TOO_LONG}]}]),
        "trl",
        ["row 1", "max_prompt_tokens=128"],
    ),
    "fewer rows than a batch": (
        jsonl([TRL_ROW, TRL_ROW]),
        "trl",
        ["data.batch_size: got 4", "expected 1..2"],
    ),
    "huge": (jsonl([TRL_ROW] * 40_000), "trl", ["MB, expected a JSONL file of prompts of at most 1 MB"]),
}


@pytest.mark.parametrize("case", list(DATA_JSONL))
def test_jsonl_data_file(case, tmp_path, capsys):
    content, fmt, needles = DATA_JSONL[case]
    path = placed(tmp_path / "train.jsonl", content)
    out = tmp_path / "run"
    argv = train_argv(out, "data.source=file", f"data.path={path}", f"data.format={fmt}")
    argv += ["data.max_file_mb=1", "generation.max_prompt_tokens=128"]
    needles = [*needles] if case == "fewer rows than a batch" else [str(path), *needles]
    refused(capsys, argv, *needles)
    assert not out.exists()


def _parquet(path: Path, rows: list[dict] | None = None, table: pa.Table | None = None) -> bytes:
    pq.write_table(table if table is not None else pa.Table.from_pylist(rows), path)
    return path.read_bytes()


DATA_PARQUET: dict[str, tuple[Callable[[Path], bytes], list[str]]] = {
    "empty": (lambda p: b"", ["not a readable Parquet file"]),
    "truncated": (lambda p: _parquet(p, [VERL_ROW] * 8)[:-40], ["not a readable Parquet file"]),
    "not Parquet": (lambda p: b"PAR1 this is not parquet", ["not a readable Parquet file"]),
    "wrong type": (lambda p: _parquet(p, [{**VERL_ROW, "prompt": 7}]), ["row 1", "'prompt': got int"]),
    "missing column": (
        lambda p: _parquet(p, [{"prompt": "q", "x": 1}]),
        ["row 1", "'reward_model': missing"],
    ),
    "null": (
        lambda p: _parquet(p, [{"prompt": None, "reward_model": {"ground_truth": "4"}}]),
        ["'prompt': got null"],
    ),
    "binary (non-UTF-8) column": (
        lambda p: _parquet(p, table=pa.table({"prompt": pa.array([NOT_UTF8], pa.binary())})),
        ["row 1", "'prompt': got bytes"],
    ),
    "over-long prompt": (
        lambda p: _parquet(p, [{**VERL_ROW, "prompt": TOO_LONG}]),
        ["row 1", "max_prompt_tokens"],
    ),
}


@pytest.mark.parametrize("case", list(DATA_PARQUET))
def test_parquet_data_file(case, tmp_path, capsys):
    make, needles = DATA_PARQUET[case]
    path = tmp_path / "train.parquet"
    write(path, make(path))
    out = tmp_path / "run"
    argv = train_argv(out, "data.source=file", f"data.path={path}", "data.format=verl")
    refused(capsys, [*argv, "generation.max_prompt_tokens=128"], str(path), *needles)
    assert not out.exists()


def test_huge_parquet_is_refused_before_it_is_read(tmp_path, capsys):
    path, rng = tmp_path / "big.parquet", random.Random(0)  # random text: Parquet cannot compress it
    pq.write_table(pa.table({"prompt": [rng.randbytes(512).hex() for _ in range(1200)]}), path)
    assert path.stat().st_size > 1 << 20
    out = tmp_path / "run"
    argv = train_argv(out, "data.source=file", f"data.path={path}", "data.max_file_mb=1")
    refused(capsys, argv, str(path), "MB, expected a Parquet file of prompts of at most 1 MB")


def test_duplicate_rows_are_distinct_prompts(tmp_path):
    """Duplicate uid is n/a for data files: a uid hashes the row's index with its content."""
    from rlhfless.data import DataConfig, load_prompts

    path = write(tmp_path / "dup.jsonl", jsonl([TRL_ROW, TRL_ROW]))
    prompts = load_prompts(DataConfig(source="file", path=str(path)))
    assert len({p.uid for p in prompts}) == 2


# ----- reward.model: a local sequence-classification checkpoint directory -------------------------

REWARD_MODEL: dict[str, tuple[Callable[[Path], None] | None, list[str]]] = {
    "missing": (None, ["not found", "expected a checkpoint directory"]),
    "a file": (lambda d: write(d, "x") and None, ["is a file", "expected a checkpoint directory"]),
    "empty directory": (lambda d: d.mkdir(), ["config.json: not found"]),
    "empty config": (lambda d: (d.mkdir(), write(d / "config.json", "")) and None, ["config.json: empty"]),
    "truncated config": (
        lambda d: (d.mkdir(), write(d / "config.json", '{"model_type": "ll')) and None,
        ["invalid JSON"],
    ),
    "null config": (
        lambda d: (d.mkdir(), write(d / "config.json", "null")) and None,
        ["got a JSON NoneType"],
    ),
    "non-UTF-8 config": (lambda d: (d.mkdir(), write(d / "config.json", NOT_UTF8)) and None, ["not UTF-8"]),
    "no weights": (
        lambda d: (d.mkdir(), write(d / "config.json", "{}")) and None,
        ["no weights", "*.safetensors"],
    ),
}


@pytest.mark.parametrize("case", list(REWARD_MODEL))
def test_reward_model_path(case, tmp_path, capsys):
    make, needles = REWARD_MODEL[case]
    where = tmp_path / "rm"
    if make is not None:
        make(where)
    out = tmp_path / "run"
    refused(capsys, train_argv(out, f"reward.model={where}"), "reward.model", str(where), *needles)
    assert not out.exists()


# ----- reward.function=module:fn (trusted code, but its mistakes are still one line) --------------

REWARD_FN = {
    "missing module": (None, "f", ["cannot import module"]),
    "missing function": ("def g(prompt, response):\n    return 1.0\n", "f", ["has no callable 'f'"]),
    "not callable": ("f = 3\n", "f", ["has no callable 'f'"]),
    "truncated module": ("def f(prompt, response):\n    return (1.0\n", "f", ["SyntaxError", "line"]),
    "empty module": ("", "f", ["has no callable 'f'"]),
    "non-UTF-8 module": (NOT_UTF8, "f", ["SyntaxError"]),
}


@pytest.mark.parametrize("case", list(REWARD_FN))
def test_reward_function(case, tmp_path, capsys, monkeypatch):
    source, attr, needles = REWARD_FN[case]
    name = "rf_" + case.replace(" ", "_").replace("-", "_")
    if source is not None:
        write(tmp_path / f"{name}.py", source)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    refused(capsys, train_argv(out, f"reward.function={name}:{attr}"), "reward.function", name, *needles)
    assert not out.exists()


def test_reward_function_spec_without_a_colon(tmp_path, capsys):
    refused(
        capsys,
        train_argv(tmp_path / "run", "reward.function=nocolon"),
        "reward.function",
        "'module:function'",
    )


def test_reward_function_returning_null_stops_before_the_step_is_recorded(tmp_path, capsys, monkeypatch):
    """Its return is only known when called: step 1 stops, and nothing of it is recorded."""
    write(tmp_path / "rf_null.py", "def f(prompt, response):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    refused(
        capsys, train_argv(out, "reward.function=rf_null:f"), "reward.function rf_null:f", "returned None"
    )
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()
    assert not (out / "checkpoints").exists()


# ----- measured profile JSON: runtime.profile (train) and --profile (plan) ------------------------


def _profile(**changes) -> str:
    data = {**PROFILE, **changes}
    return json.dumps({k: v for k, v in data.items() if v != "DROP"})


PROFILE_CASES = {
    "missing": (None, ["not found", "expected a profile table"]),
    "empty": ("", ["empty"]),
    "wrong type": (_profile(gpus="two"), ["gpus: got 'two'", "expected an integer"]),
    "not an object": ("[1, 2]", ["got a JSON list", "expected a profile table"]),
    "missing key": (_profile(decode="DROP"), ["decode: missing"]),
    "null": (_profile(max_kv_tokens=None), ["max_kv_tokens: got None"]),
    "null point": (_profile(prefill=[None]), ["profile points: got a malformed point"]),
    "non-UTF-8": (NOT_UTF8, ["byte 0 is not UTF-8"]),
    "truncated": (_profile()[:50], ["invalid JSON", "truncated?"]),
    "duplicate point": (
        _profile(decode=PROFILE["decode"] * 2),
        ["decode: got a (batch, context) point twice"],
    ),
    "huge": (" " * (17 << 20), ["MB, expected a profile table"]),
}


@pytest.mark.parametrize("case", list(PROFILE_CASES))
def test_profile_for_train(case, tmp_path, capsys):
    content, needles = PROFILE_CASES[case]
    path = placed(tmp_path / "profile.json", content)
    out = tmp_path / "run"
    refused(capsys, train_argv(out, f"runtime.profile={path}"), str(path), *needles)
    assert not out.exists()


def _plan_argv(prompts: Path, *extra: str) -> list[str]:
    return ["plan", "--prompts", str(prompts), *extra]


@pytest.mark.parametrize("case", ["missing", "truncated", "duplicate point"])
def test_profile_for_plan(case, tmp_path, capsys):
    content, needles = PROFILE_CASES[case]
    path = placed(tmp_path / "profile.json", content)
    prompts = write(tmp_path / "p.jsonl", jsonl([{"uid": "a", "prompt_tokens": [1, 2]}]))
    refused(capsys, _plan_argv(prompts, "--profile", str(path)), str(path), *needles)
    assert capsys.readouterr().out == ""


# ----- rlhfless plan --prompts FILE.jsonl ---------------------------------------------------------

PROMPT = {"uid": "a", "prompt_tokens": [1, 2, 3]}
PLAN_PROMPTS = {
    "missing": (None, ["no such file"]),
    "empty": ("", ["no prompts"]),
    "wrong type": (jsonl([{**PROMPT, "prompt_tokens": "abc"}]), [":1: prompt_tokens: got abc"]),
    "not an object": (jsonl([[1]]), [":1: got list", "expected a JSON object"]),
    "missing key": (jsonl([{"prompt_tokens": [1]}]), [":1: uid: got None"]),
    "null": (
        jsonl([PROMPT, {**PROMPT, "uid": "b", "answer_tokens": None, "history": None}]),
        [":2: history"],
    ),
    "non-UTF-8": (jsonl([PROMPT]).encode() + NOT_UTF8, ["line 2: byte 0 is not UTF-8"]),
    "truncated": (jsonl([PROMPT]) + jsonl([PROMPT])[:12], [":2: not valid JSON"]),
    "duplicate uid": (jsonl([PROMPT, PROMPT]), [":2: uid: got 'a' again", "expected unique uids"]),
    "over-long prompt": (
        jsonl([{**PROMPT, "prompt_tokens": [1] * 20}]),
        [":1: prompt_tokens: got 20 tokens"],
    ),
    "huge": (jsonl([PROMPT] * 40_000), ["MB, expected a JSONL file of prompts of at most 1 MB"]),
}


@pytest.mark.parametrize("case", list(PLAN_PROMPTS))
def test_plan_prompts(case, tmp_path, capsys, monkeypatch):
    from rlhfless.commands import plan

    monkeypatch.setattr(plan, "MAX_PROMPTS_BYTES", 1 << 20)
    content, needles = PLAN_PROMPTS[case]
    path = placed(tmp_path / "prompts.jsonl", content)
    refused(capsys, _plan_argv(path, "generation.max_prompt_tokens=16"), str(path), *needles)


def test_plan_config_file_is_checked_like_train_s(tmp_path, capsys):
    config = write(tmp_path / "c.yaml", NOT_UTF8)
    prompts = write(tmp_path / "p.jsonl", jsonl([PROMPT]))
    refused(capsys, _plan_argv(prompts, "--config", str(config)), str(config), "not UTF-8")


# ----- rlhfless simulate CONFIG.yaml, and its section.key=value overrides ----------------------------

SIM_YAML = {
    "missing": (None, [], ["sim.yaml: not found", "expected a simulator config"]),
    "empty": ("\n", [], ["sim.yaml: empty", "expected a simulator config"]),
    "non-UTF-8": (b"cluster: " + NOT_UTF8, [], ["sim.yaml: byte 9 is not UTF-8"]),
    "truncated": (
        "cluster: {nodes: 2\n",
        [],
        ["sim.yaml: line 2: not valid YAML", "expected a simulator config"],
    ),
    "not a mapping": ("- a\n- b\n", [], ["sim.yaml: got list", "(a mapping)"]),
    "huge": ("#" * (17 << 20), [], ["sim.yaml: 17.0 MB, expected a simulator config", "at most 16 MB"]),
    "section not a mapping": ("cluster: 3\n", [], ["cluster: got 3", "expected a section"]),
    "unknown key": ("cluster: {nodez: 2}\n", [], ["cluster: got ['nodez']", "expected keys among"]),
    "wrong type": ("cluster: {nodes: abc}\n", [], ["cluster.nodes: got 'abc'", "valid integer"]),
    "fraction": ("training: {steps: 2.5}\n", [], ["training.steps: got 2.5", "fractional part"]),
    "out of range": ("workload: {samples: 0}\n", [], ["workload.samples: got 0", "an integer >= 1"]),
    "override wrong type": ("cluster: {nodes: 1}\n", ["cluster.nodes=abc"], ["cluster.nodes: got 'abc'"]),
    "override not dotted": ("cluster: {nodes: 1}\n", ["nodes=2"], ["override: got 'nodes=2'"]),
}


@pytest.mark.parametrize("case", list(SIM_YAML))
def test_simulator_config(case, tmp_path, capsys):
    content, overrides, needles = SIM_YAML[case]
    path = placed(tmp_path / "sim.yaml", content)
    out = tmp_path / "out"
    refused(capsys, ["simulate", str(path), *overrides, "--no-sweeps", "--output", str(out)], *needles)
    assert not out.exists()


# ----- run directories: rlhfless report -----------------------------------------------------------


@pytest.mark.parametrize(
    "make, needles",
    [
        pytest.param(lambda d: None, ["not found", "expected a run directory"], id="missing"),
        pytest.param(lambda d: write(d, "x"), ["is a file", "expected a run directory"], id="a file"),
        pytest.param(lambda d: d.mkdir(), ["no metrics.jsonl or config.yaml"], id="empty directory"),
        pytest.param(
            lambda d: (d.mkdir(), write(d / "metrics.jsonl", "{}\n" * 600_000)),
            ["metrics.jsonl:", "MB, expected", "at most 1 MB"],
            id="huge metrics",
        ),
    ],
)
def test_report_refuses_what_is_not_a_run(make, needles, tmp_path, capsys, monkeypatch):
    from rlhfless.commands import report

    monkeypatch.setattr(report, "MAX_METRICS_BYTES", 1 << 20)
    where = tmp_path / "run"
    make(where)
    before = snapshot(where) if where.is_dir() else None
    refused(capsys, ["report", str(where)], str(where), *needles)
    assert (snapshot(where) if where.is_dir() else None) == before


@pytest.mark.parametrize(
    "damage, problem",
    [
        pytest.param(
            lambda m: m.write_text(m.read_text()[:-20]),
            "is not valid JSON (truncated write?)",
            id="truncated",
        ),
        pytest.param(
            lambda m: m.write_bytes(m.read_bytes() + NOT_UTF8 + b"\n"), "is not valid JSON", id="non-UTF-8"
        ),
        pytest.param(
            lambda m: m.write_text(m.read_text() + '{"step": null}\n'), "without an integer `step`", id="null"
        ),
        pytest.param(
            lambda m: m.write_text(m.read_text() + '{"reward/mean": 1}\n'),
            "without an integer",
            id="missing key",
        ),
        pytest.param(lambda m: m.write_text(m.read_text() + "[1]\n"), "not a JSON object", id="wrong type"),
    ],
)
def test_report_draws_a_damaged_run_and_lists_the_damage(damage, problem, run_copy, tmp_path, capsys):
    """A killed run's last write is cut short by design: the page skips the line and says so."""
    damage(run_copy / "metrics.jsonl")
    before = snapshot(run_copy)
    page = tmp_path / "page.html"
    assert main(["report", str(run_copy), "--out", str(page)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert problem in page.read_text(encoding="utf-8")
    assert snapshot(run_copy) == before


# ----- run directories: rlhfless export -----------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _other_model(path: Path) -> None:
    """The weights of a model of another size, under the same names."""
    tensors = load_file(str(path))
    name = next(iter(tensors))
    tensors[name] = tensors[name][..., :8].contiguous()
    save_file(tensors, str(path))


CHECKPOINT = "checkpoints/step_000001"
EXPORT = {
    "empty directory": (
        lambda run: [p.unlink() for p in run.rglob("*") if p.is_file()],
        ["expected a run directory"],
    ),
    "config missing": (lambda run: (run / "config.yaml").unlink(), ["config.yaml: not found"]),
    "config empty": (lambda run: write(run / "config.yaml", ""), ["config.yaml: empty"]),
    "config non-UTF-8": (
        lambda run: write(run / "config.yaml", NOT_UTF8),
        ["config.yaml: byte 0 is not UTF-8"],
    ),
    "weights missing": (lambda run: (run / CHECKPOINT / "model.safetensors").unlink(), ["model.safetensors"]),
    "weights truncated": (
        lambda run: _truncate(run / CHECKPOINT / "model.safetensors"),
        ["not a readable safetensors"],
    ),
    "another model's weights": (
        lambda run: _other_model(run / CHECKPOINT / "model.safetensors"),
        ["has shape"],
    ),
}


@pytest.mark.parametrize("case", list(EXPORT))
def test_export(case, run_copy, tmp_path, capsys):
    damage, needles = EXPORT[case]
    damage(run_copy)
    before = snapshot(run_copy)
    target = tmp_path / "exported"
    refused(capsys, ["export", str(run_copy), str(target)], str(run_copy), *needles)
    assert not target.exists() and snapshot(run_copy) == before


# ----- run directories: rlhfless train --resume ---------------------------------------------------

TRAINER_STATE = f"{CHECKPOINT}/trainer_state.json"
RESUME = {
    "no checkpoint": (
        lambda run: [p.unlink() for p in (run / CHECKPOINT).iterdir()],
        [],
        ["no checkpoint under"],
    ),
    "state empty": (lambda run: write(run / TRAINER_STATE, ""), [], ["trainer_state.json: empty"]),
    "state truncated": (
        lambda run: _truncate(run / TRAINER_STATE),
        [],
        ["trainer_state.json: line", "invalid JSON"],
    ),
    "state non-UTF-8": (lambda run: write(run / TRAINER_STATE, NOT_UTF8), [], ["trainer_state.json: byte 0"]),
    "state wrong type": (
        lambda run: write(run / TRAINER_STATE, "[1]"),
        [],
        ["trainer_state.json: got a JSON list"],
    ),
    "state missing key": (
        lambda run: write(run / TRAINER_STATE, '{"step": 1, "predictor": {}}'),
        [],
        ["key 'loader'"],
    ),
    "state null": (lambda run: write(run / TRAINER_STATE, '{"step": null}'), [], ["key 'step': got None"]),
    "state held-out lengths wrong type": (
        lambda run: write(run / TRAINER_STATE, '{"step": 1, "loader": {}, "predictor": {}, "validation": 3}'),
        [],
        ["key 'validation': got 3", "expected a mapping with the held-out lengths"],
    ),
    "rng missing": (lambda run: (run / CHECKPOINT / "rng.json").unlink(), [], ["rng.json: not found"]),
    "optimizer missing": (
        lambda run: (run / CHECKPOINT / "optimizer.pt").unlink(),
        [],
        ["optimizer.pt: not found"],
    ),
    "optimizer truncated": (
        lambda run: _truncate(run / CHECKPOINT / "optimizer.pt"),
        [],
        ["optimizer.pt: refused"],
    ),
    "optimizer without its version": (
        lambda run: torch.save({"learner": {}}, run / CHECKPOINT / "optimizer.pt"),
        [],
        ["optimizer.pt: keys 'learner' and 'version'", "expected"],
    ),
    "weights truncated": (
        lambda run: _truncate(run / CHECKPOINT / "model.safetensors"),
        [],
        ["not a readable"],
    ),
    "another model's weights": (
        lambda run: _other_model(run / CHECKPOINT / "model.safetensors"),
        [],
        ["model.safetensors: tensor", "has shape"],
    ),
    "another model": (
        lambda run: None,
        ["model.tiny_hidden_size=32"],
        ["config.yaml: model.tiny_hidden_size"],
    ),
    "another algorithm": (
        lambda run: None,
        ["algorithm.name=rloo"],
        ["algorithm.name: the checkpoint's run has"],
    ),
    "another data set": (lambda run: None, ["data.size=20"], ["data.size", "expected the same value"]),
    "config damaged": (
        lambda run: write(run / "config.yaml", NOT_UTF8),
        [],
        ["config.yaml: byte 0 is not UTF-8"],
    ),
}


@pytest.mark.parametrize("case", list(RESUME))
def test_resume(case, run_copy, capsys):
    damage, overrides, needles = RESUME[case]
    damage(run_copy)
    before = snapshot(run_copy)
    argv = [*train_argv(run_copy, "trainer.steps=2", *overrides), "--resume"]
    refused(capsys, argv, str(run_copy), *needles)
    assert snapshot(run_copy) == before
