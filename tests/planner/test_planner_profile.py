"""Profile tables: interpolation, extrapolation, JSON round trip, validation."""

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


def test_prefill_interpolates_clamps_below_and_extrapolates_above():
    p = small_profile()
    got = p.prefill_seconds([0, 50, 100, 550, 1000, 2000]) * 1e3
    np.testing.assert_allclose(got, [0.0, 10.0, 10.0, 55.0, 100.0, 200.0])


def test_decode_is_bilinear_inside_and_linear_beyond_the_grid():
    p = small_profile()
    np.testing.assert_allclose(p.decode_step_seconds(6, 600) * 1e3, 25.0)
    np.testing.assert_allclose(p.decode_step_seconds(1, 2100) * 1e3, 30.0)
    np.testing.assert_allclose(p.decode_step_seconds(21, 100) * 1e3, 50.0)
    np.testing.assert_allclose(p.decode_step_seconds([0, 1], [500, 50]) * 1e3, [0.0, 10.0])


def test_json_round_trip(tmp_path):
    p = small_profile()
    path = tmp_path / "profile.json"
    p.save(path)
    q = Profile.load(path)
    assert q.to_dict() == p.to_dict()
    assert q.gpus == 2 and q.max_kv_tokens == 5000


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
