"""What `rlhfless train` shows a person: a spinner while the run is forecast, then its forecast line."""

import io

from rich.console import Console

from rlhfless.commands.plan_summary import forecast_line
from rlhfless.commands.train import Display

FORECAST = {
    "steps": 3,
    "time_s": 12.0,
    "cost": 0.5,
    "time_range_s": [9.0, 14.0],
    "cost_range": [0.4, 0.6],
    "range": "predicted lengths x 0.5 .. x 1.5",
}


def test_the_forecast_spinner_runs_until_the_forecast_is_printed():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system=None, highlight=False, width=200)
    display = Display(console, enabled=True)
    display("forecasting", {"steps": 3})
    assert display.status is not None
    display("forecast", FORECAST)
    assert display.status is None
    last = out.getvalue().replace("\r", "\n").splitlines()[-1]
    assert last.endswith(
        "forecast for 3 step(s): 12 s (9-14), $0.5 ($0.4-0.6); predicted lengths x 0.5 .. x 1.5"
    )


def test_a_probe_far_from_the_earlier_runs_is_noted_beside_the_forecast_not_among_errors(capsys):
    """stderr holds a run's errors and the warnings it acts on, one line each: a bad input's one
    line stays alone there whatever the machine's load made the probe read."""
    out = io.StringIO()
    display = Display(Console(file=out, width=60), enabled=False)
    display("forecast", FORECAST | {"memory/speed": 2.32})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("forecast for 3 step(s)")
    assert lines[-1].startswith("warning: the speed probe reads this machine's step times x2.32")
    assert capsys.readouterr().err == ""


def test_a_run_refused_while_forecasting_stops_the_spinner():
    display = Display(Console(file=io.StringIO(), force_terminal=True), enabled=True)
    display("forecasting", {"steps": 3})
    display.finish()  # what `train` calls when the forecast refuses a budget
    assert display.status is None


def test_no_spinner_without_a_terminal():
    display = Display(Console(file=io.StringIO()), enabled=False)
    display("forecasting", {"steps": 3})
    assert display.status is None


def test_a_forecast_under_ten_seconds_keeps_two_digits_rather_than_rounding_to_zero():
    tiny = FORECAST | {"time_s": 0.214, "time_range_s": [0.15, 0.3]}
    assert forecast_line(tiny).startswith("forecast for 3 step(s): 0.21 s (0.15-0.3), ")


STEP = {
    "step": 1,
    "reward/mean": 0.0234375,
    "response_length/mean": 45.2,
    "response_length/max": 160,
    "kl/mean": 0.0,
    "loss/policy": -0.21875,
    "grad_norm": 1.57,
    "time/generation": 46.3,
    "time/preparation": 0.0123,
    "time/learning": 27.6,
    "time/step": 74.1,
}


def test_a_log_of_80_columns_keeps_every_figure_whole():
    out = io.StringIO()
    display = Display(Console(file=out, width=80, color_system=None), enabled=False)
    display("start", {"output_dir": "runs/x", "steps": 1, "start": 0})
    display("step", STEP)
    display.finish()
    text = out.getvalue()
    assert "…" not in text
    step_line = next(line for line in text.splitlines() if line.startswith("step    1 |"))
    assert step_line.endswith("| step s 74.1")  # one line, not wrapped at the console's width
    for figure in ("0.0234", "-0.219", "0.0123", "74.1"):
        assert f" {figure} " in text
