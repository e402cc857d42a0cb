"""Per-prompt response-length prediction and its quality statistics.

A prompt is sampled again every epoch and its response length is stable across steps, so the
prediction is an EWMA over the prompt's last `window` observations (window 1 = last observation).
With G samples per prompt the planner needs the group's max (when the group finishes) and mean
(how much work it is), so both are tracked. A prompt never seen uses its ground-truth answer's
token count times a factor, else a default. Modes: `ewma`; `oracle` (told the true lengths of the
coming step via `reveal`); `noisy` (EWMA times a deterministic log-normal factor, for sensitivity
studies: the same state and uids always give the same predictions).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlhfless.planner.config import SchedulerConfig

MODES = ("ewma", "oracle", "noisy")
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a good 64-bit mixer, vectorised (uint64 arithmetic wraps)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
    return x ^ (x >> np.uint64(31))


def _uid_hash(uid: str) -> int:
    return zlib.crc32(uid.encode())


class LengthPredictor:
    """Predicts each prompt's group max and group mean response length from its history."""

    def __init__(
        self,
        window: int = 1,
        default_length: int = 256,
        answer_length_factor: float = 1.0,
        mode: str = "ewma",
        noise: float = 0.5,
        seed: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: got {mode!r}, expected one of {', '.join(MODES)}")
        if window < 1:
            raise ValueError(f"window: got {window}, expected an integer >= 1")
        self.window = window
        self.default_length = default_length
        self.answer_length_factor = answer_length_factor
        self.mode = mode
        self.noise = noise
        self.seed = seed
        self._history: dict[str, list[tuple[float, float]]] = {}
        # Cached predictions by row, so predict() is one dict lookup per uid and then numpy.
        self._row: dict[str, int] = {}
        self._max = np.zeros(0)
        self._mean = np.zeros(0)
        self._count = np.zeros(0, dtype=np.uint64)
        self._hash = np.zeros(0, dtype=np.uint64)
        self._truth: dict[str, tuple[float, float]] = {}

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> LengthPredictor:
        return cls(
            window=config.ewma_window,
            default_length=config.default_length,
            answer_length_factor=config.answer_length_factor,
            mode=config.predictor,
            noise=config.noise,
            seed=config.seed,
        )

    def _ensure_row(self, uid: str) -> int:
        row = self._row.get(uid)
        if row is None:
            row = len(self._row)
            self._row[uid] = row
            if row >= self._max.size:
                grow = max(16, 2 * self._max.size)
                self._max = np.resize(self._max, grow)
                self._mean = np.resize(self._mean, grow)
                self._count = np.resize(self._count, grow)
                self._hash = np.resize(self._hash, grow)
            self._hash[row] = _uid_hash(uid)
        return row

    def _ewma(self, values: list[float]) -> float:
        alpha = 2.0 / (self.window + 1)
        smoothed = values[0]
        for x in values[1:]:
            smoothed = alpha * x + (1 - alpha) * smoothed
        return smoothed

    def update(self, uid: str, observed_lengths: Sequence[int]) -> None:
        """Record the response lengths (one per sample) this step produced for `uid`."""
        if len(observed_lengths) == 0:
            raise ValueError(f"observed_lengths for {uid!r}: got none, expected one length per sample")
        self._push(uid, float(max(observed_lengths)), float(np.mean(observed_lengths)))
        self._truth.pop(uid, None)

    def reveal(self, uid: str, true_lengths: Sequence[int]) -> None:
        """Oracle mode: the lengths the coming step will really produce for `uid`."""
        self._truth[uid] = (float(max(true_lengths)), float(np.mean(true_lengths)))

    def predict(
        self, uids: Sequence[str], answer_tokens: Sequence[int | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(group max, group mean) predicted response lengths, one entry per uid."""
        rows = np.fromiter((self._row.get(u, -1) for u in uids), dtype=np.int64, count=len(uids))
        seen = rows >= 0
        safe = np.where(seen, rows, 0)
        gmax = np.where(seen, self._max[safe] if self._max.size else 0.0, np.nan)
        gmean = np.where(seen, self._mean[safe] if self._mean.size else 0.0, np.nan)
        if not seen.all():
            fallback = np.full(len(uids), float(self.default_length))
            if answer_tokens is not None:
                answers = np.array([np.nan if a is None else a for a in answer_tokens], dtype=float)
                fallback = np.where(np.isnan(answers), fallback, answers * self.answer_length_factor)
            gmax = np.where(seen, gmax, fallback)
            gmean = np.where(seen, gmean, fallback)
        if self.mode == "oracle" and self._truth:
            for i, uid in enumerate(uids):
                truth = self._truth.get(uid)
                if truth is not None:
                    gmax[i], gmean[i] = truth
        if self.mode == "noisy" and self.noise > 0:
            factor = self._noise_factor(uids, rows, seen)
            gmax, gmean = gmax * factor, gmean * factor
        return np.maximum(gmax, 1.0), np.clip(gmean, 1.0, np.maximum(gmax, 1.0))

    def _noise_factor(self, uids: Sequence[str], rows: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """exp(N(0, noise)) keyed on (seed, uid, observations so far): deterministic, not stateful."""
        safe = np.where(seen, rows, 0)
        hashes = np.where(seen, self._hash[safe] if self._hash.size else 0, 0).astype(np.uint64)
        counts = np.where(seen, self._count[safe] if self._count.size else 0, 0).astype(np.uint64)
        for i in np.flatnonzero(~seen):
            hashes[i] = _uid_hash(uids[i])
        key = _splitmix(hashes ^ (counts << np.uint64(32)) ^ np.uint64(self.seed & 0xFFFFFFFF))
        u1 = (_splitmix(key) >> np.uint64(11)).astype(float) / 2.0**53
        u2 = (_splitmix(key ^ np.uint64(0xA5A5A5A5)) >> np.uint64(11)).astype(float) / 2.0**53
        normal = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
        return np.exp(self.noise * normal)

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "history": {uid: [list(obs) for obs in past] for uid, past in self._history.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["window"]) != self.window:
            raise ValueError(f"window: got {state['window']} in the state, expected {self.window}")
        self._history.clear()
        self._row.clear()
        self._max, self._mean = np.zeros(0), np.zeros(0)
        self._count, self._hash = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
        for uid, past in state["history"].items():
            for obs_max, obs_mean in past:
                self._push(uid, float(obs_max), float(obs_mean))

    def _push(self, uid: str, obs_max: float, obs_mean: float) -> None:
        past = self._history.setdefault(uid, [])
        past.append((obs_max, obs_mean))
        del past[: -self.window]
        row = self._ensure_row(uid)
        self._max[row] = self._ewma([p[0] for p in past])
        self._mean[row] = self._ewma([p[1] for p in past])
        self._count[row] += np.uint64(1)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.state_dict()) + "\n")

    def load(self, path: str | Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text()))


def _inversions(y: np.ndarray) -> int:
    """Pairs i < j with y[i] > y[j], for integer ranks y in [0, n): bottom-up merge, vectorised."""
    n = y.size
    y = y.astype(np.int64)
    idx = np.arange(n)
    total = 0
    width = 1
    while width < n:
        block = idx // (2 * width)
        left = (idx % (2 * width)) < width
        key = y + block * n
        lkeys = key[left]
        rkeys, rblock = key[~left], block[~left]
        pos = np.searchsorted(lkeys, rkeys, side="right")
        end = np.searchsorted(lkeys, (rblock + 1) * n, side="left")
        total += int((end - pos).sum())
        y = np.sort(key) - block * n
        width *= 2
    return total


def _tied_pairs(x: np.ndarray) -> int:
    _, counts = np.unique(x, return_counts=True)
    return int((counts * (counts - 1) // 2).sum())


def kendall_tau(x: Any, y: Any) -> float:
    """Kendall's tau-b in O(n log n); nan when either side is constant or has < 2 points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    if n < 2:
        return float("nan")
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    ranks = np.unique(ys, return_inverse=True)[1]
    discordant = _inversions(ranks)
    n0 = n * (n - 1) // 2
    n1, n2 = _tied_pairs(xs), _tied_pairs(ys)
    n3 = _tied_pairs(xs + 1j * ys)
    denom = np.sqrt(float(n0 - n1) * float(n0 - n2))
    if denom == 0:
        return float("nan")
    return float((n0 - n1 - n2 + n3 - 2 * discordant) / denom)


def prediction_quality(predicted: Any, observed: Any) -> dict[str, float]:
    """Report figures: mean absolute error, share within 50 / 100 tokens, Kendall tau of the ranking."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    if p.shape != o.shape or p.size == 0:
        raise ValueError(f"predicted/observed: got shapes {p.shape} and {o.shape}, expected equal, non-empty")
    err = np.abs(p - o)
    return {
        "mae": float(err.mean()),
        "within_50": float((err <= 50).mean()),
        "within_100": float((err <= 100).mean()),
        "kendall_tau": kendall_tau(p, o),
    }
