"""What a run writes as it goes: metrics, rollouts, plans, TensorBoard and W&B."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rlhfless.files import write_atomic
from rlhfless.inputs import InputError, read_json


def _finite(value: Any) -> Any:
    """JSON has no NaN: non-finite floats are written as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


WANDB_RUN = "wandb_run.json"  # the run's W&B id, for a resume to log on into


class RunLog:
    """Appends one metrics line per step and writes per-step files atomically."""

    def __init__(
        self, root: Path, tensorboard: bool, wandb_project: str | None, config: dict, resumed_at: int = 0
    ) -> None:
        """`resumed_at`: the checkpoint's step a resumed run goes on from. What a killed run
        recorded after it is forgotten, in `metrics.jsonl` and in TensorBoard (whose events
        from that step on are purged), since those steps are redone."""
        self.root = root
        self.metrics_path = root / "metrics.jsonl"
        self.validation_path = root / "validation.jsonl"
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(root / "tb"), purge_step=resumed_at + 1 if resumed_at else None)
        if resumed_at:
            for path in (self.metrics_path, self.validation_path):
                truncate_after(path, resumed_at)
        self.wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError(
                    "trainer.wandb=true needs the 'wandb' package (pip install wandb)"
                ) from err
            self.wandb = wandb.init(
                project=wandb_project,
                name=root.name,
                config=config,
                dir=str(root),
                **self._wandb_resume(resumed_at),
            )
            write_atomic(root / WANDB_RUN, json.dumps({"id": self.wandb.id}))

    def _wandb_resume(self, resumed_at: int) -> dict[str, str]:
        """A resumed run logs on into the W&B run it started (its id kept in the run directory),
        as W&B's `resume="allow"` does for a requeued job; W&B drops the redone steps it already
        has (a step may not go back), whose samples and metrics are the same."""
        path = self.root / WANDB_RUN
        if not resumed_at or not path.is_file():
            return {}
        known = read_json(path, "the run's W&B id (written by the run)").get("id")
        if not isinstance(known, str):
            raise InputError(f"{path}: got id {known!r}, expected the W&B run's id as a string")
        return {"id": known, "resume": "allow"}

    def rows(self) -> list[dict]:
        """Every step's metrics recorded so far, steps before a resume included."""
        return read_rows(self.metrics_path)

    def validations(self) -> list[dict]:
        """Every validation recorded so far (step 0: the initial policy's), resumes included."""
        return read_rows(self.validation_path)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """A step's metrics: a line of `metrics.jsonl`, TensorBoard and W&B scalars."""
        self._append(self.metrics_path, step, values)

    def validation(self, step: int, values: dict[str, float]) -> None:
        """A validation's metrics: a line of `validation.jsonl` (its own file, since step 0's
        validation has no step's metrics beside it), and the same scalars at that step."""
        self._append(self.validation_path, step, values)

    def _append(self, path: Path, step: int, values: dict[str, float]) -> None:
        record = {"step": step, **{k: _finite(v) for k, v in values.items()}}
        with path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        for key, value in values.items():
            if self.tb is not None and isinstance(value, int | float) and math.isfinite(value):
                self.tb.add_scalar(key, value, step)
        if self.tb is not None:
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def step_file(self, folder: str, step: int, payload: Any) -> None:
        """`folder/step_NNNNNN.json` (a dict) or `.jsonl` (a list of records)."""
        if isinstance(payload, list):
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in payload)
            write_atomic(self.root / folder / f"step_{step:06d}.jsonl", text)
        else:
            write_atomic(self.root / folder / f"step_{step:06d}.json", json.dumps(payload, indent=1))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_rows(path: Path) -> list[dict]:
    """The records of a JSON-lines log (none where it is not written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_after(path: Path, step: int) -> None:
    """On resume, forget what a log holds of steps after the checkpoint (they will be redone), and
    a last line cut short by a kill (a step after the checkpoint too: its line came first)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if row.get("step", 0) <= step:
            kept.append(row)
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in kept))
