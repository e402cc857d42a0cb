"""The roofline profile derived from specs must agree with published measurements."""

import json

import pytest

from rlhfless.planner.hardware import (
    BUILTIN_GPUS,
    BUILTIN_MODELS,
    TABLE_BATCHES,
    TABLE_LENGTHS,
    GpuSpec,
    ModelShape,
    Roofline,
    roofline_profile,
    roofline_table,
)

TOKENS = (1, 32, 128, 256, 512, 1024, 2048, 4096)
# Vidur non-attention forward times (ms), hardware_facts.md.
VIDUR = {
    ("llama-2-7b", 1): (5.60, 5.79, 6.37, 9.15, 11.98, 21.0, 40.4, 83.2),
    ("llama-2-70b", 8): (8.36, 9.28, 10.0, 11.5, 17.7, 32.6, 63.7, 122.3),
}


@pytest.mark.parametrize(("model", "tp"), list(VIDUR))
def test_linear_time_lands_within_25_percent_of_vidur_on_h100(model, tp):
    roof = Roofline(BUILTIN_MODELS[model], BUILTIN_GPUS["h100"], tp)
    for tokens, measured in zip(TOKENS, VIDUR[(model, tp)], strict=True):
        assert roof.linear_ms(tokens) == pytest.approx(measured, rel=0.25), tokens


@pytest.mark.parametrize(
    ("model", "billions"),
    [
        ("qwen2.5-3b", 3.09),
        ("qwen2.5-7b", 7.6),
        ("llama-2-7b", 6.7),
        ("llama-2-70b", 69),
        ("smollm2-135m", 0.135),
    ],
)
def test_parameter_counts_match_the_model_cards(model, billions):
    assert BUILTIN_MODELS[model].params / 1e9 == pytest.approx(billions, rel=0.03)


def test_hf_config_gives_the_same_shape_as_the_builtin(tmp_path):
    config = {
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = ModelShape.from_hf_config(tmp_path)
    builtin = BUILTIN_MODELS["llama-2-70b"]
    assert (shape.params, shape.kv_bytes_per_token) == (builtin.params, builtin.kv_bytes_per_token)


def test_decode_step_adds_what_vidur_omits():
    roof = Roofline(BUILTIN_MODELS["llama-2-70b"], BUILTIN_GPUS["h100"], 8)
    assert roof.decode_ms(1, 1) > roof.linear_ms(1) + roof.step_overhead_ms
    assert roof.decode_ms(32, 4096) > roof.decode_ms(32, 256)  # attention grows with context
    assert roof.allreduce_ms(32) > 0 and Roofline(roof.model, roof.gpu, 1).allreduce_ms(32) == 0


def test_decode_is_memory_bound_so_batching_is_nearly_free_per_step():
    roof = Roofline(BUILTIN_MODELS["llama-2-7b"], BUILTIN_GPUS["h100"], 1)
    assert roof.decode_ms(32, 256) < 1.5 * roof.decode_ms(1, 256)


def test_table_has_the_issue_grid_and_fits_kv_capacity():
    table = roofline_table("llama-2-70b", "h100", tp=8)
    assert {row["batch"] for row in table["decode"]} == set(TABLE_BATCHES) >= {1, 32, 128, 256}
    assert [row["tokens"] for row in table["prefill"]] == list(TABLE_LENGTHS)
    assert TABLE_LENGTHS[0] == 1 and TABLE_LENGTHS[-1] == 8192
    assert max(b - a for a, b in zip(TABLE_LENGTHS, TABLE_LENGTHS[1:], strict=False)) <= 256
    # 8 x 80 GB x 0.9 minus 138 GB of weights, 40 KiB of KV per token per GPU: ~1.3M tokens.
    assert table["gpus"] == 8 and 1.0e6 < table["max_kv_tokens"] < 1.6e6


def test_model_too_big_for_the_gpus_is_refused():
    with pytest.raises(ValueError, match="tp: got 1"):
        _ = Roofline(BUILTIN_MODELS["llama-2-70b"], BUILTIN_GPUS["h100"], 1).max_kv_tokens


def test_unknown_gpu_and_bad_spec_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="gpu: got 'tpu'"):
        GpuSpec.resolve("tpu")
    with pytest.raises(ValueError, match="memory_tbps"):
        GpuSpec.from_dict({**vars(BUILTIN_GPUS["h100"]), "memory_tbps": 0})
    custom = GpuSpec.resolve({**vars(BUILTIN_GPUS["h100"]), "name": "h100x2", "memory_tbps": 6.7})
    h100 = Roofline(BUILTIN_MODELS["llama-2-7b"], BUILTIN_GPUS["h100"])
    assert Roofline(h100.model, custom).decode_ms(1, 1) < h100.decode_ms(1, 1)


def test_roofline_profile_interpolates_the_derived_table():
    profile = roofline_profile("llama-2-70b", "h100", tp=8, cold_start_s=20.0)
    roof = Roofline(BUILTIN_MODELS["llama-2-70b"], BUILTIN_GPUS["h100"], 8)
    assert profile.gpus == 8 and profile.cold_start_s == 20.0
    assert float(profile.decode_step_seconds(32, 1024)) * 1e3 == pytest.approx(
        roof.decode_ms(32, 1024), rel=1e-3
    )
    assert float(profile.prefill_seconds(4096)) * 1e3 == pytest.approx(roof.prefill_ms(4096), rel=1e-3)
