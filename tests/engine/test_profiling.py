"""The engine profile has the planner's Profile layout and sensible, measured entries."""

from __future__ import annotations

import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfless.engine.profiling import kv_bytes_per_token, measure_profile


def test_profile_has_every_requested_point_in_the_planner_format():
    torch.set_num_threads(1)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    profile = measure_profile(model, batches=[1, 4], contexts=[8, 32], prefill_tokens=[16, 64], repeats=2)
    assert json.loads(json.dumps(profile)) == profile
    assert [(d["batch"], d["context"]) for d in profile["decode"]] == [(1, 8), (1, 32), (4, 8), (4, 32)]
    assert [p["tokens"] for p in profile["prefill"]] == [16, 64]
    assert all(entry["ms"] > 0 for entry in profile["decode"] + profile["prefill"])
    assert profile["gpus"] == 1
    assert kv_bytes_per_token(model) == 2 * 2 * 1 * 16 * 4
    assert profile["max_kv_tokens"] > 1000


def test_a_measured_profile_carries_a_function_start_and_a_cached_one_without_it_gets_one(
    tmp_path, monkeypatch
):
    """A run's first plans priced every function start at 0 s where the profile had none."""
    from rlhfless.planner import Profile
    from rlhfless.runtime import machine

    assert machine.function_start_s() > 0  # a fresh interpreter importing a decode function's modules
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    path = tmp_path / "profiles" / f"{machine.cache_key(model, 1)}.json"
    path.parent.mkdir()
    table = measure_profile(model, batches=[1, 4], contexts=[8, 32], prefill_tokens=[16, 64], repeats=1)
    Profile.from_dict(table).save(path)  # cached before starts were measured
    monkeypatch.setattr(machine, "function_start_s", lambda: 4.5)
    assert machine.measured_profile(model, str(tmp_path), 1).cold_start_s == 4.5
    assert Profile.load(path).cold_start_s == 4.5  # and kept
