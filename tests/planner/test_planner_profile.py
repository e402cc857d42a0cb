"""Profile tables: interpolation, extrapolation, JSON round trip, validation."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfless.planner.profile import Profile, _Cells


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


def reference_lerp(grid, values, x):
    """Scalar piecewise-linear lookup: first value below the grid, last segment extended above."""
    if len(grid) == 1 or x <= grid[0]:
        return values[0]
    i = min(max(j for j in range(len(grid)) if grid[j] <= x), len(grid) - 2)
    return values[i] + (x - grid[i]) * (values[i + 1] - values[i]) / (grid[i + 1] - grid[i])


@settings(max_examples=80, deadline=None)
@given(
    batches=st.lists(st.integers(1, 300), min_size=1, max_size=4, unique=True),
    contexts=st.lists(st.integers(1, 5000), min_size=1, max_size=5, unique=True),
    seed=st.integers(0, 2**16),
    b=st.floats(0.5, 600),
    c=st.floats(0, 9000),
)
def test_decode_lookup_matches_a_row_then_column_reference(batches, contexts, seed, b, c):
    batches, contexts = sorted(batches), sorted(contexts)
    ms = np.random.default_rng(seed).uniform(1, 50, (len(batches), len(contexts)))
    points = [
        {"batch": bb, "context": cc, "ms": float(ms[i, j])}
        for i, bb in enumerate(batches)
        for j, cc in enumerate(contexts)
    ]
    p = Profile.from_dict(
        {"prefill": [{"tokens": 1, "ms": 1.0}], "decode": points, "gpus": 1, "max_kv_tokens": 9}
    )
    along_context = [reference_lerp(contexts, row, c) for row in ms]
    expected = max(reference_lerp(batches, along_context, b), 0.0)
    np.testing.assert_allclose(p.decode_step_seconds(b, c) * 1e3, expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=120, deadline=None)
@given(
    batches=st.lists(st.integers(1, 300), min_size=1, max_size=5, unique=True),
    contexts=st.lists(st.integers(1, 5000), min_size=1, max_size=5, unique=True),
    seed=st.integers(0, 2**16),
    b=st.one_of(st.integers(-2, 700), st.floats(-2, 700)),
    c=st.floats(-10, 9000),
)
def test_one_step_lookup_is_the_vectorised_lookups_float_exactly(batches, contexts, seed, b, c):
    ms = np.random.default_rng(seed).uniform(1, 50, (len(batches), len(contexts)))
    points = [
        {"batch": bb, "context": cc, "ms": float(ms[i, j])}
        for i, bb in enumerate(sorted(batches))
        for j, cc in enumerate(sorted(contexts))
    ]
    p = Profile.from_dict(
        {"prefill": [{"tokens": 1, "ms": 1.0}], "decode": points, "gpus": 1, "max_kv_tokens": 9}
    )
    assert p.step_seconds(b, c) == float(p.decode_step_seconds(b, c))


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


@settings(max_examples=60, deadline=None)
@given(
    grid=st.lists(st.floats(0, 1e5, allow_nan=False), min_size=1, max_size=30, unique=True),
    x=st.lists(st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from([np.inf, -np.inf]), max_size=50),
)
def test_decode_cells_are_found_as_a_binary_search_finds_them(grid, x):
    """The bucket table that finds decode cells counts exactly what `searchsorted` counts, for
    points on, next to and between the grid's, and for grids it falls back on."""
    grid = np.array(sorted(grid))
    xs = np.r_[x, grid, np.nextafter(grid, np.inf), np.nextafter(grid, -np.inf), (grid[1:] + grid[:-1]) / 2]
    cells = _Cells(grid)
    assert cells(xs).tolist() == np.searchsorted(grid[1:-1], xs, side="right").tolist()
