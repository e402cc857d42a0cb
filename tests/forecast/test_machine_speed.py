"""The cached time figures follow the machine's speed now: decode steps timed as the run starts,
against the same steps in the cached table, scale the table, the learning rate and the run memory.
"""

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.planner import ClusterSpec, Profile
from rlhfless.planner.config import SchedulerConfig
from rlhfless.runtime import machine
from rlhfless.runtime.machine import PROBE_BATCHES, PROBE_CONTEXT, Speed
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.run_forecast import learning_seconds_per_token


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_a_cached_table_is_scaled_by_the_probe_and_one_measured_now_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "function_start_s", lambda: 4.0)  # a fresh interpreter's imports
    model = tiny_model()
    fresh, speed = machine.measured_profile(model, str(tmp_path), 1)
    table_ms = tuple(1000 * float(fresh.decode_step_seconds(b, PROBE_CONTEXT)) for b in PROBE_BATCHES)
    assert speed == Speed(table_ms, table_ms) and speed.factor == 1.0  # measured in this hour

    timed = machine.probe(model, 1)
    assert len(timed) == len(PROBE_BATCHES) and min(timed) > 0  # the table's own steps, timed
    # A machine 3x slower now, but for one point whose table figure was timed in a stall: the
    # median of the points' ratios is the machine's.
    now = (3 * table_ms[0], 3 * table_ms[1], table_ms[2])
    monkeypatch.setattr(machine, "probe", lambda *args: now)
    slow, speed = machine.measured_profile(model, str(tmp_path), 1)
    assert speed.factor == pytest.approx(3.0) and speed.since(now) == 1.0
    assert speed.since(now[:1]) == 1.0  # steps of another probe say nothing
    np.testing.assert_allclose(slow.decode_ms, 3 * fresh.decode_ms)
    np.testing.assert_allclose(slow.prefill_ms, 3 * fresh.prefill_ms)
    assert slow.cold_start_s == pytest.approx(12.0)  # imports run on the same CPUs

    cached, speed = machine.measured_profile(model, str(tmp_path), 1, probing=False)
    assert speed.factor == 1.0 and np.array_equal(cached.decode_ms, fresh.decode_ms)


def test_the_learning_rate_is_cached_with_the_speed_it_was_timed_at_and_scaled_to_the_speed_now(tmp_path):
    cfg = load_config(preset="tiny", overrides=(f"model.cache_dir={tmp_path}",))
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, len(tokenizer), cfg.seed)
    prompt = [1, 2, 3, 4]
    timed = learning_seconds_per_token(policy, cfg, prompt, Speed((5.0,), (10.0,)))
    [cache] = (tmp_path / "profiles").glob("learn-*.json")
    assert json.loads(cache.read_text())["probe_ms"] == [10.0]
    assert learning_seconds_per_token(policy, cfg, prompt, Speed((5.0,), (25.0,))) == pytest.approx(
        2.5 * timed
    )
    assert learning_seconds_per_token(policy, cfg, prompt) == pytest.approx(timed)  # no probe: as cached
    cache.write_text(json.dumps({"seconds_per_token": timed}))  # cached before speeds were kept
    assert learning_seconds_per_token(policy, cfg, prompt, Speed((5.0,), (25.0,))) == pytest.approx(timed)


def test_the_run_memory_is_rescaled_from_the_speed_it_was_written_at_its_decode_scale_kept(tmp_path):
    memory = tmp_path / "calibration.json"
    profile = Profile([1.0, 1000.0], [0.0, 0.0], [1.0, 1000.0], [0.0, 1e4], np.full((2, 2), 10.0))

    def planner(speed: Speed | None) -> StepPlanner:
        return StepPlanner(SchedulerConfig(), profile, ClusterSpec(1, 2), 2, memory=memory, speed=speed)

    written = planner(Speed((10.0,), (10.0,)))
    written.calibration.decode_scale, written.calibration.overhead_s = 1.3, 2.0
    written.calibration.rank_start_s = 6.0
    written.phases.observe(1000.0, 4.0, width=2)
    written.waits.observe(1, 2, 0.5)
    state = written.state_dict()
    assert state["probe_ms"] == [10.0]
    memory.write_text(json.dumps(state))

    later = planner(Speed((10.0,), (15.0,)))  # 1.5x slower than when it was written
    assert later.calibration.decode_scale == 1.3  # a ratio to the table, which the probe scales
    assert later.calibration.overhead_s == pytest.approx(3.0)
    assert later.calibration.rank_start_s == pytest.approx(9.0)
    assert later.phases.per_token_s == pytest.approx(0.006) and later.phases.by_width[2] == pytest.approx(
        0.006
    )
    assert later.waits.waits[1] == pytest.approx(0.75)
    assert planner(None).phases.per_token_s == pytest.approx(0.004)  # a table it did not measure
