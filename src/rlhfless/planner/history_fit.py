"""How far a prompt's own past lengths predict its next: a least-squares line over the seen
prompts of the last steps, from what the predictor held for each to what it then produced.

A prompt seen before is predicted from its history, taken as it is until this fit has enough
prompts. How much that history says depends on the run: in a random simulated sweep (session 47),
the slope of the next group max on the last was 0.91-0.96 on a GPQA-like PPO run of one sample at
a 1k cap, and -0.07 to 0.43 on four others, sixteen-sample GRPO among them. Taken as it is where
it says little, a plan sorts and balances prompts by noise: on those runs rlhfless generated slower
than verl's even split. The fit's slope is kept within [0, 1]: a history never counts for more
than itself, and where it counts for nothing the prediction is the seen prompts' mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FIT_STEPS = 8  # steps of seen prompts the line is fitted to (lengths drift as the policy trains)
FIT_PROMPTS = 16  # seen prompts before the line replaces the history taken as it is


@dataclass
class HistoryFit:
    """Per step: the count, sums and products of (history, next) over its seen prompts."""

    sums: list[list[float]] = field(default_factory=list)  # per step: n, Σx, Σy, Σxx, Σxy

    def observe(self, history: np.ndarray, produced: np.ndarray) -> None:
        """Fold in one step's seen prompts: what each was predicted from, what it produced."""
        x, y = np.asarray(history, dtype=float), np.asarray(produced, dtype=float)
        if x.size:
            step = [x.size, x.sum(), y.sum(), x @ x, x @ y]
            self.sums = [*self.sums, [float(v) for v in step]][-FIT_STEPS:]

    def line(self) -> tuple[float, float]:
        """(intercept, slope) of the fit; (0, 1), the history as it is, until `FIT_PROMPTS`."""
        if not self.sums:
            return 0.0, 1.0
        n, sx, sy, sxx, sxy = np.sum(self.sums, axis=0)
        spread = sxx - sx * sx / n
        if n < FIT_PROMPTS or spread <= 1e-9 * max(sxx, 1.0):
            return 0.0, 1.0
        slope = float(np.clip((sxy - sx * sy / n) / spread, 0.0, 1.0))
        return float((sy - slope * sx) / n), slope

    def __call__(self, history: np.ndarray) -> np.ndarray:
        intercept, slope = self.line()
        return history if slope == 1.0 and intercept == 0.0 else intercept + slope * history
