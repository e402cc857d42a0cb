"""Profile tables: interpolation, extrapolation, JSON round trip, validation."""

from dataclasses import replace

import numpy as np
import pytest

from rlhfless.planner.profile import Profile


def small_profile() -> Profile:
    return Profile.from_dict(
        {
            "prefill": [{"tokens": 100, "ms": 10.0}, {"tokens": 1000, "ms": 100.0}],
            "decode": [
                {"batch": 1, "context": 100, "ms": 10.0},
                {"batch": 1, "context": 1100, "ms": 20.0},
                {"batch": 11, "context": 100, "ms": 30.0},
                {"batch": 11, "context": 1100, "ms": 40.0},
            ],
            "gpus": 2,
            "max_kv_tokens": 5000,
        }
    )


def test_prefill_interpolates_clamps_below_and_runs_longer_inputs_chunk_by_chunk():
    p = small_profile()
    got = p.prefill_seconds([0, 50, 100, 550, 1000, 2000, 2550]) * 1e3
    np.testing.assert_allclose(got, [0.0, 10.0, 10.0, 55.0, 100.0, 200.0, 255.0])
    chunked = replace(p, prefill_chunk=500)  # 1000 tokens = two chunks of 500 (50 ms each)
    np.testing.assert_allclose(chunked.prefill_seconds([1000, 1100]) * 1e3, [100.0, 110.0])


def test_concurrency_is_bounded_by_kv_memory_and_the_engine_batch_limit():
    p = small_profile()  # 5000 KV tokens
    np.testing.assert_array_equal(p.concurrency([100, 1000, 10000]), [50, 5, 1])
    np.testing.assert_array_equal(replace(p, max_batch=8).concurrency([100, 1000]), [8, 5])


def test_decode_is_bilinear_inside_and_linear_beyond_the_grid():
    p = small_profile()
    np.testing.assert_allclose(p.decode_step_seconds(6, 600) * 1e3, 25.0)
    np.testing.assert_allclose(p.decode_step_seconds(1, 2100) * 1e3, 30.0)
    np.testing.assert_allclose(p.decode_step_seconds(21, 100) * 1e3, 50.0)
    np.testing.assert_allclose(p.decode_step_seconds([0, 1], [500, 50]) * 1e3, [0.0, 10.0])


def test_json_round_trip(tmp_path):
    p = replace(small_profile(), max_batch=64, prefill_chunk=512)
    path = tmp_path / "profile.json"
    p.save(path)
    q = Profile.load(path)
    assert q.to_dict() == p.to_dict()
    assert q.gpus == 2 and q.max_kv_tokens == 5000 and q.max_batch == 64 and q.prefill_chunk == 512


def test_incomplete_decode_grid_is_rejected():
    data = small_profile().to_dict()
    data["decode"].pop()
    with pytest.raises(ValueError, match="full grid"):
        Profile.from_dict(data)


def test_missing_key_is_named():
    data = small_profile().to_dict()
    del data["max_kv_tokens"]
    with pytest.raises(ValueError, match="max_kv_tokens"):
        Profile.from_dict(data)
