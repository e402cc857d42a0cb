"""How far a prompt's own past lengths predict its next: a least-squares line over the seen
prompts of the last steps, from what the predictor held for each to what it then produced, both
as departures from what the prompt's source would estimate for it unseen (its answer's length
where answers fit the source; the predictor passes them so).

A prompt seen before was predicted from its history alone, taken as it was. How much a history
adds to its source's estimate depends on the run. In a random simulated sweep (session 47), the
next group max correlated with the last at 0.91-0.97 (three runs). But as departures from the
answers' estimate, the slope of one on the other was -0.07 to 0.43 on four runs where rlhfless
generated slower than verl (PPO of one sample, and GRPO of sixteen), and 0.91-0.96 on a fifth.
Taken as it is where it adds little, a history makes a plan sort and balance prompts by noise.
The slope is kept within [0, 1]: a history never counts for more than itself, and where it adds
nothing the prediction is the source's estimate, shifted by the fit's intercept. Until
`FIT_PROMPTS` seen prompts are fitted, a history is taken as it is.
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

    @property
    def identity(self) -> bool:
        """Whether the fit takes a history as it is (too few prompts yet, or all it says holds)."""
        return self.line() == (0.0, 1.0)

    def __call__(self, history: np.ndarray) -> np.ndarray:
        intercept, slope = self.line()
        return intercept + slope * history  # the identity line gives each history back exactly
