"""Any local causal LM checkpoint loads for RL: its shape read whatever its config calls the
fields, and every dropout off, in train mode too."""

from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from rlhfless.cli import main
from rlhfless.config import ModelConfig
from rlhfless.models import ModelError, load_model, model_shape, tiny_model
from rlhfless.planner.hardware import ModelShape


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A random GPT-2 checkpoint: `n_head`, `n_embd`, `n_layer`, no `intermediate_size`, and
    dropout 0.1 everywhere, as GPT-2's configs keep it."""
    config = GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    assert config.resid_pdrop == config.attn_pdrop == config.embd_pdrop == 0.1
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    return path


def test_a_checkpoint_with_dropout_gives_the_same_logprobs_in_train_mode(gpt2_dir):
    """The learner trains in train mode; a live dropout made step 1's KL nonzero."""
    model = load_model(ModelConfig(path=str(gpt2_dir)), vocab_size=0)
    tokens = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        rollout = model(tokens).logits
        model.train()
        assert torch.equal(model(tokens).logits, rollout)
        assert torch.equal(model(tokens).logits, rollout)


def test_the_shape_is_read_under_the_config_s_own_field_names(gpt2_dir):
    shape = model_shape(load_model(ModelConfig(path=str(gpt2_dir)), vocab_size=0))
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads) == (2, 32, 4, 4)
    assert (shape.intermediate, shape.vocab, shape.head_dim) == (4 * 32, 300, 8)


def test_a_llama_shape_is_what_its_config_json_says():
    model = tiny_model(ModelConfig(path="tiny"), vocab_size=259, seed=0)
    assert model_shape(model) == ModelShape.from_hf_config(model.config.to_dict())


def test_a_config_without_a_field_the_planner_needs_is_one_line_naming_it():
    text = SimpleNamespace(name_or_path="m", model_type="odd", hidden_size=8, num_hidden_layers=1)
    model = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text, name_or_path="m"))
    with pytest.raises(ModelError, match=r"^model.path: m: config.json: missing 'num_attention_heads'"):
        model_shape(model)


def test_a_hub_id_not_in_the_local_cache_is_one_line_and_never_fetched(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    argv = [
        "train",
        "--preset",
        "tiny",
        "model.path=nobody-here/no-such-model",
        f"output_dir={tmp_path / 'r'}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "model.path: cannot load a tokenizer from 'nobody-here/no-such-model'" in err
    )


@pytest.mark.parametrize(
    "family, config",
    [
        ("llama", {"intermediate_size": 96, "num_key_value_heads": 2}),
        ("mistral", {"intermediate_size": 96, "num_key_value_heads": 2}),
        ("qwen2", {"intermediate_size": 96, "num_key_value_heads": 2}),
        ("phi3", {"intermediate_size": 96, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
        ("gpt2", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    ],
)
def test_the_shape_counts_the_blocks_matrices_as_the_model_holds_them(family, config):
    """Weights moved and multiplied per token: a gated MLP has three matrices, GPT-2's two (the
    shape counted three for every model, GPT-2's MLP half again its size)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    common = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **common | config))
    blocks = sum(
        p.numel()
        for name, p in model.named_parameters()
        if p.ndim == 2 and not any(part in name for part in ("embed", "wte", "wpe", "lm_head"))
    )
    assert model_shape(model).layer_params == blocks
