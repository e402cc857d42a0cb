"""The run memory outlasts a speed probe that read the machine wrong: a run's seconds are kept at
the speed its decode steps showed, and what earlier runs learned gives way to the run's own."""

import json

import numpy as np
import pytest

from rlhfless.commands.plan_summary import drift_warning
from rlhfless.planner import ClusterSpec, Profile
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.forecast import FIRST_RUNS, PROBE_NOISE, speed_range
from rlhfless.runtime.machine import Speed
from rlhfless.runtime.planning import StepPlanner
from rlhfless.runtime.run_memory import RUNS, RunMemory

PROFILE = Profile([1.0, 1000.0], [0.0, 0.0], [1.0, 1000.0], [0.0, 1e4], np.full((2, 2), 10.0))


def planner(memory, probe_ms: float) -> StepPlanner:
    """A run on a machine whose probe read `probe_ms` (the table's figure is 10 ms)."""
    return StepPlanner(
        SchedulerConfig(), PROFILE, ClusterSpec(1, 2), 2, memory=memory, speed=Speed((10.0,), (probe_ms,))
    )


def leave(memory, probe_ms: float, scale: float, overhead_s: float) -> None:
    """A run probed at `probe_ms` whose steps taught it `scale` and `overhead_s` (seconds at the
    speed it actually ran at) writes the memory."""
    run = planner(memory, probe_ms)
    run.calibration.decode_scale, run.calibration.overhead_s = scale, overhead_s
    run.memory.write(run.state_dict(), scale)


def test_a_run_probed_slow_leaves_the_next_run_the_seconds_its_decode_steps_showed(tmp_path):
    memory = tmp_path / "calibration.json"
    for scale in (1.13, 1.15, 1.14, 1.14):  # quiet runs: their probes read the machine right
        leave(memory, 10.0, scale, overhead_s=2.0)
    # Beside CPU-bound processes the probe read 1.62x slow; the run itself ran at full speed, so
    # its decode steps came out 1.62x quicker than the slowed table said.
    leave(memory, 16.2, 1.14 / 1.62, overhead_s=2.0)

    later = planner(memory, 10.0)  # a quiet run after it
    assert later.calibration.decode_scale == pytest.approx(1.14)  # the runs' median
    assert later.calibration.overhead_s == pytest.approx(2.0)  # was 2.0 / 1.62: 38% short
    assert json.loads(memory.read_text())["scales"] == pytest.approx([1.13, 1.15, 1.14, 1.14, 1.14 / 1.62])


def test_a_run_alone_or_in_step_with_the_others_keeps_its_probe(tmp_path):
    memory = tmp_path / "calibration.json"
    leave(memory, 12.0, 0.8, overhead_s=2.0)  # the first run: nothing to set its scale against
    assert json.loads(memory.read_text())["probe_ms"] == pytest.approx([12.0])
    assert planner(memory, 12.0).calibration.overhead_s == pytest.approx(2.0)
    leave(memory, 15.0, 0.8, overhead_s=3.0)  # a slower hour, read right
    assert json.loads(memory.read_text())["probe_ms"] == pytest.approx([15.0])
    assert planner(memory, 10.0).calibration.overhead_s == pytest.approx(2.0)


def test_the_memory_keeps_the_last_runs_scales_and_a_run_that_learned_none_adds_none(tmp_path):
    memory = tmp_path / "calibration.json"
    for scale in range(1, RUNS + 3):
        leave(memory, 10.0, float(scale), overhead_s=1.0)
    kept = json.loads(memory.read_text())["scales"]
    assert kept == [float(s) for s in range(3, RUNS + 3)]
    run = planner(memory, 10.0)
    run.memory.write(run.state_dict(), None)  # its steps have taught no decode scale yet
    assert json.loads(memory.read_text())["scales"] == kept


def test_what_earlier_runs_learned_gives_way_to_the_runs_first_taught_step(tmp_path):
    memory = tmp_path / "calibration.json"
    leave(memory, 10.0, 1.3, overhead_s=2.0)
    run = planner(memory, 10.0)
    assert run.calibration.provisional and run.phases.provisional
    run.calibration.observe(measured_busy_s=7.0, model_busy_s=10.0, measured_s=10.0, model_s=10.0)
    assert run.calibration.decode_scale == pytest.approx(0.7)  # not halfway to 1.3
    run.calibration.observe(measured_busy_s=9.0, model_busy_s=10.0, measured_s=10.0, model_s=10.0)
    assert run.calibration.decode_scale == pytest.approx(0.8)  # then blended as before
    assert not planner(tmp_path / "none.json", 10.0).calibration.provisional


def test_a_memory_kept_before_the_scales_were_counts_its_decode_scale_as_its_last_runs(tmp_path):
    memory = tmp_path / "calibration.json"
    memory.write_text(
        json.dumps({"calibration": {"decode_scale": 1.14, "overhead_s": 2.0}, "probe_ms": [10.0]})
    )
    leave(memory, 16.2, 1.14 / 1.62, overhead_s=2.0)  # probed slow: the median of two halves it
    assert json.loads(memory.read_text())["scales"] == pytest.approx([1.14, 1.14 / 1.62])
    slow, usual = 1.14 / 1.62, (1.14 + 1.14 / 1.62) / 2
    kept = planner(memory, 10.0).calibration.overhead_s  # the old rule's 2.0 / 1.62 = 1.23
    assert kept == pytest.approx(2.0 * 10.0 / (16.2 * slow / usual)) and kept == pytest.approx(1.62, abs=0.01)


@pytest.mark.parametrize(
    "text", ["{", "[]", '{"scales": "fast"}', '{"scales": 3}', '{"calibration": {"decode_scale": "x"}}']
)
def test_a_damaged_memory_is_left_unread(tmp_path, text):
    memory = tmp_path / "calibration.json"
    memory.write_text(text)
    run = planner(memory, 10.0)
    assert run.calibration.decode_scale is None and run.memory.scales == []
    assert RunMemory(tmp_path / "missing.json").read() == {}


def test_a_probe_far_from_the_earlier_runs_speed_is_named_beside_the_forecast(tmp_path):
    memory = tmp_path / "calibration.json"
    leave(memory, 10.0, 1.14, overhead_s=2.0)
    assert planner(memory, 10.0).drift == pytest.approx(1.0)
    slow = planner(memory, 16.2).drift
    assert slow == pytest.approx(1.62)
    assert planner(tmp_path / "none.json", 16.2).drift is None  # no earlier run to read it against
    assert "x1.62" in drift_warning({"memory/speed": slow})
    assert drift_warning({"memory/speed": 1.1}) is None and drift_warning({}) is None
    assert "x0.62" in drift_warning({"memory/speed": 1 / slow})  # a quiet spell: short, not long


def test_a_first_step_says_the_runs_scale_by_how_far_earlier_runs_first_steps_ran_over(tmp_path):
    memory = RunMemory(tmp_path / "calibration.json")
    assert memory.first_scale(1.3) is None  # no earlier run measured it
    for excess in (1.17, 1.07, 0.98):  # first touches: a first step's ratio over the run's scale
        memory.write({"calibration": {}, "probe_ms": None}, 1.14, excess)
        memory.read()
    assert memory.first_excess == pytest.approx([1.17, 1.07, 0.98])
    # A probe read 2x slow: the table it scaled says twice the time, so the ratio comes out half;
    # the scale from it is the run's own, whatever the probe read.
    assert memory.first_scale(1.07 * 0.57) == pytest.approx(0.57)


def test_the_forecast_range_spans_how_far_earlier_runs_here_strayed_from_their_forecast_speed(tmp_path):
    """A whole-run forecast's ends vary the machine's speed as well as the lengths: earlier runs'
    decode scales about their median (the forecast's), never narrower than one probe's noise."""
    memory = tmp_path / "calibration.json"
    assert speed_range([])[:2] == speed_range([1.2])[:2] == (1 / PROBE_NOISE, FIRST_RUNS)
    assert "no two earlier runs" in speed_range([1.2])[2]
    for scale in (1.2, 1.25, 1.15, 0.6):  # three quiet runs, then one its probe read 2x slow
        leave(memory, 10.0, scale, overhead_s=2.0)
    later = planner(memory, 10.0)
    low, high, basis = speed_range(later.memory.scales)
    usual = np.median([1.2, 1.25, 1.15, 0.6])
    assert (low, high) == pytest.approx((0.6 / usual, max(1.25 / usual, PROBE_NOISE)))
    assert basis.startswith(f"machine speed x{low:.2f} .. x{high:.2f}") and "last 4 runs" in basis
    # runs in step with each other: one probe's noise is the least a run may stray
    assert speed_range([1.2, 1.21, 1.19])[:2] == (1 / PROBE_NOISE, PROBE_NOISE)
    # A probe 2x slower than those runs ran: the range holds the run at their speed too.
    low, high, basis = speed_range([1.2, 1.21, 1.19], drift=2.0)
    assert (low, high) == (0.5, PROBE_NOISE) and "which the probe reads x2.00" in basis
    assert speed_range([1.2, 1.21, 1.19], drift=1.05)[:2] == (1 / PROBE_NOISE, PROBE_NOISE)
