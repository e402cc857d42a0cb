"""`rlhfless train [CONFIG.yaml | --preset NAME] [key=value ...]`: run synchronous GRPO/PPO."""

from __future__ import annotations

import argparse
import importlib.util
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.status import Status
from rich.table import Table

from rlhfless.commands.config_args import split_config
from rlhfless.commands.plan_summary import drift_warning, forecast_line
from rlhfless.config import PRESETS, Config, ConfigError, load_config, resolve_output_dir, to_dict
from rlhfless.devices import resolve_device
from rlhfless.inputs import InputError
from rlhfless.typed import render

SUMMARY_KEYS = (
    ("reward/mean", "reward"),
    ("response_length/mean", "len"),
    ("response_length/max", "max"),
    ("kl/mean", "kl"),
    ("loss/policy", "loss"),
    ("grad_norm", "|g|"),
    ("time/generation", "gen s"),
    ("time/preparation", "prep s"),
    ("time/learning", "learn s"),
    ("time/step", "step s"),
)

VALIDATION_KEYS = (
    ("val/reward/mean", "held-out reward"),
    ("val/response_length/mean", "len"),
    ("val/prompts", "prompts"),
    ("validation/actors", "functions"),  # on decode functions (`validation.engine=functions`)
    ("time/validation", "s"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy with synchronous GRPO/PPO")
    p.add_argument(
        "config", nargs="?", help="YAML config file or a preset's name (default: --preset default)"
    )
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.steps=3")
    p.add_argument("--preset", choices=PRESETS, help="start from a built-in preset")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from output_dir's latest checkpoint (resume=auto: where there is one, else "
        "start the run)",
    )
    p.add_argument(
        "--show-config",
        action="store_true",
        help="print the resolved config (file or preset, then overrides) as YAML, every key under its "
        "help text, and exit without training",
    )


class Display:
    """Progress bars per step and phase, a line per step, a table at the end."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console, self.enabled = console, enabled
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.task = None
        self.rows: list[dict] = []
        self.status: Status | None = None

    def __call__(self, kind: str, info: dict) -> None:
        if kind == "forecasting" and self.enabled:  # the pilot and every step planned: seconds to minutes
            self.status = self.console.status(f"forecasting {info['steps']} step(s) before paying for any")
            self.status.start()
        elif kind == "start":
            self.console.print(f"run directory: {info['output_dir']}")
            self.progress.start()
            self.task = self.progress.add_task(
                "steps", total=info["steps"], completed=info["start"], phase=""
            )
        elif kind == "forecast":
            self._stop_status()
            self.console.print(forecast_line(info))
            drift = drift_warning(info)
            if drift:  # a note on the forecast, beside it as `plan --run` prints it: not on stderr,
                # which holds a run's errors and the warnings it acts on, one line each
                self.console.print(f"warning: {drift}", markup=False, soft_wrap=True)
            if info.get("warning"):
                print(f"rlhfless: warning: {info['warning']}", file=sys.stderr)  # one line
        elif kind == "warning":
            print(f"rlhfless: warning: {info['message']}", file=sys.stderr)  # one line
        elif kind == "phase":
            self.progress.update(self.task, phase=f"step {info['step']}: {info['phase']}")
        elif kind == "validation":
            parts = [
                f"{label} {info[key]:.3g}" for key, label in VALIDATION_KEYS if info.get(key) is not None
            ]
            self.progress.console.print(f"val  {info['step']:>4} | " + " | ".join(parts), soft_wrap=True)
        elif kind == "step":
            self.rows.append(info)
            self.progress.update(self.task, advance=1, phase="")
            parts = [f"{label} {info[key]:.3g}" for key, label in SUMMARY_KEYS if info.get(key) is not None]
            # One line whatever the console's width: a log file's console is 80 columns wide.
            self.progress.console.print(f"step {info['step']:>4} | " + " | ".join(parts), soft_wrap=True)

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def finish(self) -> None:
        self._stop_status()
        self.progress.stop()
        if not self.rows:
            return
        table = Table(title="training summary")
        table.add_column("step", justify="right")
        for _, label in SUMMARY_KEYS:
            table.add_column(label, justify="right")
        for row in self.rows:
            table.add_row(
                str(row["step"]),
                *(f"{row[k]:.3g}" if row.get(k) is not None else "-" for k, _ in SUMMARY_KEYS),
            )
        # As wide as its figures need: a narrower console (a log file's: 80 columns) cuts them.
        width = self.console.width
        self.console.width = max(
            width, self.console.measure(table, options=self.console.options.update_width(999)).maximum
        )
        try:
            self.console.print(table)
        finally:
            self.console.width = width


def _load(path: str | None, preset: str | None, overrides: tuple[str, ...]) -> Config:
    """`load_config`, with a mistake that is the file's own (not an override's) named by its path."""
    try:
        return load_config(path, preset, overrides)
    except ConfigError as err:
        if not path or path in str(err):
            raise
        try:
            load_config(path)
        except ConfigError as alone:
            if str(alone) == str(err):
                raise ConfigError(f"{path}: {err}") from None
        raise


def _check_resume(cfg: Config) -> None:
    """Before anything loads or writes: the run to resume was trained with a compatible config."""
    from rlhfless.runtime.checkpoint import check_resume, list_checkpoints, resumes

    out = resolve_output_dir(cfg)
    if resumes(cfg.resume, list_checkpoints(out / "checkpoints")) and (out / "config.yaml").exists():
        check_resume(out, to_dict(cfg))


def _check_loggers(cfg: Config) -> None:
    """Before anything is written: a logger the config asks for is installed."""
    if cfg.trainer.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "config error: trainer.wandb: got true, expected the 'wandb' package installed "
            "(pip install wandb), or trainer.wandb=false"
        )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=False)
    try:
        items = ([args.config] if args.config else []) + list(args.overrides)
        path, preset, overrides = split_config(items, args.preset)
        if args.resume:
            overrides.append("resume=true")
        cfg = resolve_device(_load(path, preset, tuple(overrides)))  # as the run records it
        if args.show_config:
            print(render(cfg), end="")
            return 0
        _check_resume(cfg)
        _check_loggers(cfg)
    except (ConfigError, InputError) as err:
        print(f"rlhfless: {err}", file=sys.stderr)
        return 2
    from rlhfless.data import DataError
    from rlhfless.models import ModelError
    from rlhfless.rewards import RewardError
    from rlhfless.runtime.ray_cluster import ClusterError
    from rlhfless.runtime.trainer import TrainError, train

    display = Display(console, cfg.trainer.progress and console.is_terminal)
    try:
        result = train(cfg, display)
    except (ClusterError, DataError, InputError, ModelError, RewardError, TrainError) as err:
        display.finish()
        print(f"rlhfless: {err}", file=sys.stderr)
        return 2
    display.finish()
    if not result.history and not cfg.validation.only:  # a resumed run already at trainer.steps
        console.print(f"nothing to train: the run is at trainer.steps={cfg.trainer.steps}; raise it to go on")
    console.print(f"run written to {result.output_dir}")
    if cfg.trainer.report and not cfg.validation.only:  # a validation alone has no step to report
        from rlhfless.report import write_report

        console.print(f"report: {write_report([result.output_dir])}")
    return 0
