"""`rlhfless export` turns a checkpoint into a model directory that loads as `model.path=`."""

import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from rlhfless.cli import main
from rlhfless.config import ModelConfig
from rlhfless.models import load_model, load_tokenizer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step tiny run with a checkpoint per step."""
    run = tmp_path_factory.mktemp("export") / "run"
    args = ["train", "--preset", "tiny", f"output_dir={run}", "trainer.steps=2", "trainer.save_every=1"]
    assert main([*args, "trainer.progress=false", "trainer.report=false"]) == 0
    return run


def test_the_exported_model_is_the_checkpoint_s_policy(run, tmp_path, capsys):
    out = tmp_path / "policy"
    assert main(["export", str(run), str(out)]) == 0
    assert "step_000002" in capsys.readouterr().out  # the newest checkpoint
    model = load_model(ModelConfig(path=str(out)), vocab_size=0)
    weights = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    state = model.state_dict()
    assert weights and all(torch.equal(state[name], tensor) for name, tensor in weights.items())
    tokenizer = load_tokenizer(ModelConfig(path=str(out)))
    chat = [{"role": "user", "content": "2 + 3?"}]
    want = load_tokenizer(ModelConfig(path="tiny")).apply_chat_template(chat, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True) == want


def test_one_checkpoint_exports_by_its_own_path(run, tmp_path):
    out = tmp_path / "policy"
    assert main(["export", str(run / "checkpoints" / "step_000001"), str(out)]) == 0
    model = load_model(ModelConfig(path=str(out)), vocab_size=0)
    weights = load_file(run / "checkpoints" / "step_000001" / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in weights.items())


def test_a_directory_without_checkpoints_is_refused_by_name(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "checkpoints/step_N" in err
    assert not (tmp_path / "out").exists()


def test_an_existing_target_is_never_overwritten(run, tmp_path, capsys):
    out = tmp_path / "policy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(run), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_the_exported_folder_and_every_checkpoint_file_are_readable_as_a_plain_mkdir_makes_them(
    run, tmp_path
):
    """mkdtemp and safetensors make them owner-only; a model is served, a run read, by others."""
    out = tmp_path / "policy"
    assert main(["export", str(run), str(out)]) == 0
    mask = os.umask(0o022)
    os.umask(mask)
    checkpoint = run / "checkpoints" / "step_000002"
    for folder in (out, checkpoint):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~mask
        assert {stat.S_IMODE(f.stat().st_mode) for f in folder.iterdir()} == {0o666 & ~mask}
