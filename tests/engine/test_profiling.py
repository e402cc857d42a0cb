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
    profile, _ = machine.measured_profile(model, str(tmp_path), 1, probing=False)
    assert profile.cold_start_s == 4.5
    assert Profile.load(path).cold_start_s == 4.5  # and kept


def test_a_kv_budget_holds_no_point_past_it_and_extends_those_along_their_batch(monkeypatch):
    """A first run measures its profile in the driver: the grid's largest point once held 3.0 GB."""
    from rlhfless.engine import profiling

    torch.set_num_threads(1)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    per_token = kv_bytes_per_token(model)
    held = []  # KV tokens of each timed point
    reserve = profiling.SlotCache.reserve

    def recorded(self, n, span):
        held.append(n * span)
        return reserve(self, n, span)

    monkeypatch.setattr(profiling.SlotCache, "reserve", recorded)
    budget = 4 * 128 * per_token  # 4 sequences of 127 tokens (span 128) fit; 4 of 255 do not
    table = measure_profile(
        model,
        batches=[1, 4],
        contexts=[8, 32, 127, 255, 511],
        prefill_tokens=[16],
        repeats=1,
        kv_budget_bytes=budget,
    )
    assert max(held) * per_token <= budget
    assert table["extended"] == [{"batch": 4, "context": 255}, {"batch": 4, "context": 511}]
    ms = {(d["batch"], d["context"]): d["ms"] for d in table["decode"]}
    slope = max((ms[4, 127] - ms[4, 32]) / (127 - 32), 0.0)
    assert ms[4, 511] == round(ms[4, 127] + slope * (511 - 127), 4)
    assert ms[4, 255] <= ms[4, 511]
    unbudgeted = measure_profile(model, batches=[1], contexts=[8, 32], prefill_tokens=[16], repeats=1)
    assert unbudgeted["extended"] == []


def test_a_row_with_fewer_than_two_points_under_the_budget_still_times_its_first_two():
    """A line needs two points: a budget smaller than any point times each batch's first two."""
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    table = measure_profile(
        model, batches=[2], contexts=[8, 32, 64], prefill_tokens=[16], repeats=1, kv_budget_bytes=1
    )
    assert table["extended"] == [{"batch": 2, "context": 64}]


def test_a_model_with_a_position_table_is_timed_only_within_it():
    """GPT-2 fails past its `n_positions`: contexts past them are extended, longer prefills not
    timed, and a lone context past them (the speed probe's) is timed at the last position."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=2, n_positions=40))
    table = measure_profile(model, batches=[1, 2], contexts=[8, 32, 64], prefill_tokens=[16, 64], repeats=1)
    assert table["extended"] == [{"batch": 1, "context": 64}, {"batch": 2, "context": 64}]
    assert [p["tokens"] for p in table["prefill"]] == [16]
    probe = measure_profile(model, batches=[1], contexts=[256], prefill_tokens=[], repeats=1)
    assert probe["decode"][0]["ms"] > 0 and probe["extended"] == []
    assert probe["prefill"] == []  # the probe times decode steps only


def test_the_speed_probe_prefills_nothing_and_prefills_past_the_positions_take_the_longest():
    """The probe asks for no prefill: it times none (it prefilled every position, 8,192 tokens of
    the default model on one thread, for minutes before each run's first step); asked-for prefills
    all past the positions are timed once, at the longest there is."""
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=48,
        )
    )
    assert measure_profile(model, batches=[1], contexts=[8], prefill_tokens=(), repeats=1)["prefill"] == []
    past = measure_profile(model, batches=[1], contexts=[8], prefill_tokens=[64, 128], repeats=1)
    assert [p["tokens"] for p in past["prefill"]] == [48]
