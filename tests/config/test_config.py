"""The config is YAML plus dotted overrides; every mistake is one clear line and exit code 2."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

from rlhfless.cli import main
from rlhfless.commands.config_args import split_config
from rlhfless.config import ConfigError, load_config, save_config
from rlhfless.devices import resolve_device
from rlhfless.typed import render


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(["train", *argv])
    return code, capsys.readouterr().err.strip()


def test_presets_resolve_with_overrides_applied_last():
    cfg = load_config(preset="tiny", overrides=("trainer.steps=5", "algorithm.group_size=2", "seed=7"))
    assert (cfg.trainer.steps, cfg.algorithm.group_size, cfg.seed) == (5, 2, 7)
    assert cfg.model.path == "tiny"


def test_override_values_are_parsed_as_yaml():
    cfg = load_config(
        preset="tiny", overrides=("trainer.tensorboard=false", "optim.lr=3e-4", "data.tasks={chain_sum: 1}")
    )
    assert cfg.trainer.tensorboard is False
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.data.tasks == {"chain_sum": 1}


def test_unknown_key_names_it_and_suggests_the_close_match(capsys):
    code, err = run_cli(capsys, "--preset", "tiny", "trainer.stpes=3")
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "trainer.stpes" in err and "did you mean 'trainer.steps'" in err


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="unknown key 'trainr'.*did you mean 'trainer'"):
        load_config(preset="tiny", overrides=("trainr.steps=3",))


def test_out_of_range_value_names_key_value_and_range(capsys):
    code, err = run_cli(capsys, "--preset", "tiny", "trainer.steps=0")
    assert code == 2
    assert err == "rlhfless: config error: trainer.steps: got 0, expected an integer >= 1"


def test_wrong_type_names_key_and_expected_type():
    with pytest.raises(ConfigError, match=r"algorithm.group_size: got 'many', expected a valid integer"):
        load_config(preset="tiny", overrides=("algorithm.group_size=many",))


def test_choice_value_lists_the_allowed_names():
    with pytest.raises(ConfigError, match=r"algorithm.name: got 'dpo', expected one of grpo, rloo"):
        load_config(preset="tiny", overrides=("algorithm.name=dpo",))


def test_a_group_relative_algorithm_needs_a_group_of_two():
    with pytest.raises(ConfigError, match=r"algorithm.group_size: got 1, expected an integer >= 2 for rloo"):
        load_config(preset="tiny", overrides=("algorithm.name=rloo", "algorithm.group_size=1"))
    for name in ("ppo", "reinforce_pp"):  # their baselines are a critic and the batch
        cfg = load_config(preset="tiny", overrides=(f"algorithm.name={name}", "algorithm.group_size=1"))
        assert cfg.algorithm.group_size == 1


def test_section_checks_of_other_rooms_use_the_same_form():
    with pytest.raises(ConfigError, match=r"scheduler.tau: got 1.5"):
        load_config(preset="tiny", overrides=("scheduler.tau=1.5",))


def test_a_run_refuses_the_predictors_only_the_simulator_can_tell():
    for told in ("oracle", "expected"):
        with pytest.raises(ConfigError, match=rf"scheduler.predictor: got '{told}', expected ewma or noisy"):
            load_config(preset="tiny", overrides=(f"scheduler.predictor={told}",))
    assert load_config(preset="tiny", overrides=("scheduler.predictor=noisy",)).scheduler.predictor == "noisy"


def test_a_data_file_is_never_ignored_silently():
    with pytest.raises(
        ConfigError, match=r"data.path: got 'rows.jsonl' with source='reasoning_gym', expected source=file"
    ):
        load_config(preset="tiny", overrides=("data.path=rows.jsonl",))
    assert (
        load_config(preset="tiny", overrides=("data.path=rows.jsonl", "data.source=file")).data.path
        == "rows.jsonl"
    )


def test_a_logger_that_is_not_installed_is_refused_before_the_run_directory_is_made(
    capsys, tmp_path, monkeypatch
):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a)
    )
    out = tmp_path / "run"
    code, err = run_cli(capsys, "--preset", "tiny", "trainer.wandb=true", f"output_dir={out}")
    assert code == 2 and not out.exists()
    assert err == (
        "rlhfless: config error: trainer.wandb: got true, expected the 'wandb' package installed "
        "(pip install wandb), or trainer.wandb=false"
    )


def test_missing_config_file_is_one_line_and_exit_2(capsys, tmp_path):
    code, err = run_cli(capsys, str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err == f"rlhfless: {tmp_path / 'nope.yaml'}: not found, expected a YAML config"


def test_override_without_equals_sign_is_a_config_file_pair_error(capsys, tmp_path):
    (tmp_path / "a.yaml").write_text("seed: 1\n")
    code, err = run_cli(capsys, str(tmp_path / "a.yaml"), "extra.yaml")
    assert code == 2 and "more than one config file" in err


@pytest.mark.parametrize(
    ("items", "preset", "expected"),
    [
        (["a.yaml", "trainer.steps=3"], None, ("a.yaml", None, ["trainer.steps=3"])),
        (["trainer.steps=3"], "tiny", (None, "tiny", ["trainer.steps=3"])),
        (["tiny", "trainer.steps=3"], None, (None, "tiny", ["trainer.steps=3"])),  # a preset's name
        ([], None, (None, None, [])),  # the default preset
    ],
)
def test_train_and_plan_run_read_a_config_file_or_preset_then_overrides_alike(items, preset, expected):
    assert split_config(items, preset) == expected


def test_a_config_file_and_a_preset_together_are_refused_by_train_and_plan_run(capsys, tmp_path):
    (tmp_path / "a.yaml").write_text("seed: 1\n")
    for argv in (["train", "--preset", "tiny"], ["plan", "--run", "--preset", "tiny"]):
        assert main([*argv, str(tmp_path / "a.yaml")]) == 2
        assert capsys.readouterr().err.strip().endswith("give a config file or --preset, not both")
    assert main(["plan", "--prompts", str(tmp_path / "p.jsonl"), "--preset", "tiny"]) == 2
    assert "--preset: goes with --run" in capsys.readouterr().err


def test_saved_config_loads_back_identically(tmp_path):
    cfg = load_config(preset="default", overrides=("trainer.steps=3",))
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == cfg


def test_show_config_prints_a_config_that_loads_back_with_every_key_under_its_help(tmp_path, capsys):
    argv = [
        "train",
        "--preset",
        "tiny",
        "trainer.steps=5",
        "scheduler.lam=0.5",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert main([*argv, "--show-config"]) == 0
    text = capsys.readouterr().out
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
    path = tmp_path / "shown.yaml"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg == resolve_device(load_config(preset="tiny", overrides=tuple(argv[3:])))  # as the run would
    assert render(cfg) == text
    lines = text.splitlines()
    keys = [i for i, line in enumerate(lines) if not line.lstrip().startswith("#")]
    assert all(lines[i - 1].lstrip().startswith("# ") for i in keys)  # no key without its help


def test_a_flag_may_stand_between_a_config_file_and_its_overrides(tmp_path, capsys):
    """`train run.yaml --resume trainer.steps=8`, as users type it: plain argparse refused the
    overrides after the flag."""
    path = tmp_path / "a.yaml"
    save_config(load_config(preset="tiny"), path)
    assert main(["train", str(path), "--show-config", "trainer.steps=7", "scheduler.lam=0.5"]) == 0
    cfg = load_config(str(path), overrides=("trainer.steps=7", "scheduler.lam=0.5"))
    assert capsys.readouterr().out == render(resolve_device(cfg))


def test_console_script_exits_2_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "rlhfless.cli", "train", "--preset", "tiny", "generation.top_p=2"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "generation.top_p: got 2.0, expected a number in (0, 1]" in proc.stderr


def test_the_algorithm_names_a_config_accepts_are_the_registries(monkeypatch):
    """`config.py` keeps no list of its own: a name registered in `rlhfless.algo` is valid at once."""
    from rlhfless.algo import ALGORITHMS, KL_ESTIMATORS, LOSS_AGGREGATIONS

    for registry, key in (
        (ALGORITHMS, "name"),
        (KL_ESTIMATORS, "kl_estimator"),
        (LOSS_AGGREGATIONS, "loss_agg"),
    ):
        with pytest.raises(ConfigError, match=f"algorithm.{key}: got 'new', expected one of"):
            load_config(preset="tiny", overrides=(f"algorithm.{key}=new",))
        monkeypatch.setitem(registry, "new", lambda *args: None)
        assert (
            getattr(load_config(preset="tiny", overrides=(f"algorithm.{key}=new",)).algorithm, key) == "new"
        )


def test_the_config_imports_nothing_of_the_runtime_it_configures():
    code = (
        "import sys, rlhfless.config; "
        "print([m for m in sys.modules if m == 'rlhfless.runtime' or m.startswith('rlhfless.runtime.')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ctrl_c_is_one_line_and_exit_130_not_a_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("rlhfless.commands.train.run", interrupted)
    assert main(["train", "--preset", "tiny"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "--resume" in err


def test_a_reader_that_goes_away_is_no_traceback():
    """`rlhfless ... | head`: the writer stops quietly (exit 141, as SIGPIPE's), not a traceback."""
    code = (
        "import sys; from rlhfless import cli; import rlhfless.commands.report as r; "
        "r.run = lambda args: print('x' * (1 << 22)); sys.exit(cli.main(['report', 'any']))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away before the writer is done
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_a_config_read_from_a_pipe_is_named_as_one(tmp_path, capsys):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    assert main(["train", str(fifo)]) == 2
    assert "is not a regular file (a pipe or a device), expected" in capsys.readouterr().err


def test_version_prints_the_package_s(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"rlhfless {importlib.metadata.version('rlhfless')}\n"
