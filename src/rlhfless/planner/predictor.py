"""Per-prompt response-length prediction (its quality statistics: `planner.prediction_quality`).

A prompt is sampled again every epoch and its response length is stable across steps, so the
prediction is an EWMA over the prompt's last `window` observations (window 1 = last observation).
With G samples per prompt the planner needs the group's max (when the group finishes) and mean
(how much work it is), so both are tracked.

A prompt never seen is estimated from its data source's groups (`planner.source_lengths`). A
prompt seen before counts its history, beyond that estimate, as far as histories have lately
predicted the next step's lengths (`planner.history_fit`, `ewma` mode).

Each step's samples over their group's planned max, as ratios to it (`overrun`), say how far a
sequence that outlived its prediction tends to run on (`planner.migration.remaining_tokens`). Its
groups' observed max over their planned max (`max_ratios`: the longer half of those planned under
the cap) say how far the longest of many groups outruns the longest prediction
(`planner.tail.Tail`); for prompts never seen, over what their source estimates once the step is
folded in (`source_ratios`), since that estimate is what the next unseen prompts take.

Modes: `ewma`; `oracle` (told the true lengths of the coming step via `reveal`); `expected` (told
each coming prompt's expected group max and mean via `reveal_expected`: what its length
distribution says, not what its samples will be, so the best any predictor can do that cannot
foresee sampling; the simulator knows it for its synthetic workloads); `noisy` (EWMA times a
deterministic log-normal factor, for sensitivity studies: the same state and uids always give the
same predictions).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from rlhfless.files import write_atomic
from rlhfless.planner.config import PREDICTORS, SchedulerConfig
from rlhfless.planner.history_fit import HistoryFit
from rlhfless.planner.source_lengths import SourceLengths

OVERRUN_POINTS = 256  # quantiles of a step's sample / planned group max past 1 kept (`overrun`)
RATIO_POINTS = 129  # quantiles of a step's observed / planned group max kept (`max_ratios`)

TOLD = ("oracle", "expected")  # modes whose predictions are told, not learned
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a good 64-bit mixer, vectorised (uint64 arithmetic wraps)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
    return x ^ (x >> np.uint64(31))


def _uid_hash(uid: str) -> int:
    return zlib.crc32(uid.encode())


def _ratio_quantiles(obs_max: np.ndarray, planned: Any, cap: float | None) -> list[float]:
    """Group maxima over their planned max as `RATIO_POINTS` quantiles, of the groups planned in
    the longer half: a range's longest group is among its longest predictions, and short
    predictions scatter more (the ratios of all groups put paper-physical's PPO gsm8k forecasts 5%
    long, of the longer half 3.5%). A group planned at the cap cannot outrun it, so it says nothing
    of how far a prediction is outrun. Empty where every group was planned at the cap."""
    plan = np.maximum(np.asarray(planned, dtype=float), 1.0)
    under = plan < cap if cap is not None else np.ones(plan.size, dtype=bool)
    if not under.any():
        return []
    under &= plan >= np.median(plan[under])
    ratios = np.asarray(obs_max, dtype=float)[under] / plan[under]
    return np.quantile(ratios, np.linspace(0.0, 1.0, RATIO_POINTS)).tolist()


class LengthPredictor:
    """Predicts each prompt's group max and group mean response length from its history.

    State lives in arrays indexed by a row per uid: the last `window` observations (oldest first,
    right-aligned), how many observations the uid ever had, and the cached predictions, so a
    whole step's observations are recorded in a few numpy passes (`update_many`).
    """

    def __init__(
        self,
        window: int = 1,
        default_length: int = 256,
        answer_length_factor: float = 1.0,
        mode: str = "ewma",
        noise: float = 0.5,
        seed: int = 0,
    ) -> None:
        if mode not in PREDICTORS:
            raise ValueError(f"mode: got {mode!r}, expected one of {', '.join(PREDICTORS)}")
        if window < 1:
            raise ValueError(f"window: got {window}, expected an integer >= 1")
        self.window = window
        self.default_length = default_length
        self.answer_length_factor = answer_length_factor
        self.mode = mode
        self.noise = noise
        self.seed = seed
        self._row: dict[str, int] = {}
        self._uids: list[str] = []
        self._obs = np.zeros((0, window, 2))  # [row, k, (max, mean)], most recent at k = window - 1
        self._max = np.zeros(0)
        self._mean = np.zeros(0)
        self._count = np.zeros(0, dtype=np.uint64)
        self._hash = np.zeros(0, dtype=np.uint64)
        self._truth: dict[str, tuple[float, float]] = {}
        self.sources = SourceLengths(default_length, answer_length_factor)  # prompts never seen
        self.overrun: list[float] = []  # the last planned step's sample / planned max past 1, quantiles
        self.max_ratios: list[float] = []  # its observed / planned group max, quantiles at even levels
        self.source_ratios: list[float] = []  # ... of the groups planned unseen, over their source's estimate
        self.max_fit, self.mean_fit = HistoryFit(), HistoryFit()  # what a seen prompt's history says

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

    def _rows(self, uids: Sequence[str]) -> np.ndarray:
        """Row of each uid, adding rows for new ones."""
        new = [u for u in dict.fromkeys(uids) if u not in self._row]
        if new:
            first = len(self._uids)
            self._row.update(zip(new, range(first, first + len(new)), strict=True))
            self._uids.extend(new)
            size = len(self._uids)
            if size > self._max.size:
                grow = max(16, 2 * self._max.size, size)
                self._obs = np.concatenate((self._obs, np.zeros((grow - self._obs.shape[0], self.window, 2))))
                self._max, self._mean = np.resize(self._max, grow), np.resize(self._mean, grow)
                self._count = np.concatenate((self._count, np.zeros(grow - self._count.size, np.uint64)))
                self._hash = np.resize(self._hash, grow)
            self._hash[first:size] = np.fromiter(map(_uid_hash, new), dtype=np.uint64, count=len(new))
        return np.fromiter(map(self._row.__getitem__, uids), dtype=np.int64, count=len(uids))

    @property
    def observed(self) -> int:
        """Prompts whose lengths it was taught (a pilot's included)."""
        return len(self._uids)

    def update(self, uid: str, observed_lengths: Sequence[int]) -> None:
        """Record the response lengths (one per sample) this step produced for `uid`."""
        if len(observed_lengths) == 0:
            raise ValueError(f"observed_lengths for {uid!r}: got none, expected one length per sample")
        obs_max, obs_mean = np.array([max(observed_lengths)], float), np.array([np.mean(observed_lengths)])
        self._fit_history([uid], obs_max, obs_mean)
        self.sources.observe([uid], obs_max, obs_mean)
        self._push(self._rows([uid]), obs_max, obs_mean)
        self._truth.pop(uid, None)

    def update_many(
        self,
        uids: Sequence[str],
        observed_lengths: Any,
        cap: float | None = None,
        planned: Sequence[float] | None = None,
    ) -> None:
        """`update` for many uids at once: `observed_lengths` is a (uids, samples) array or one
        sequence of lengths per uid. A uid listed twice is recorded twice, in order. `cap`: the
        response cap they were sampled under; a group that reached it says only that its length is
        at least the cap, so it teaches no answer ratio. `planned`: the group max each uid was
        planned with; the samples over it, as ratios to it, become `overrun`, and the groups'
        maxima over it `max_ratios` (and `source_ratios`)."""
        if isinstance(observed_lengths, np.ndarray) and observed_lengths.ndim == 2:
            if observed_lengths.shape[0] != len(uids) or observed_lengths.shape[1] == 0:
                raise ValueError(
                    f"observed_lengths: got shape {observed_lengths.shape}, expected ({len(uids)}, >= 1)"
                )
            values = observed_lengths.astype(float)
            obs_max, obs_mean = values.max(axis=1), values.mean(axis=1)
        else:
            counts = np.fromiter(map(len, observed_lengths), dtype=np.int64, count=len(observed_lengths))
            if counts.size != len(uids):
                raise ValueError(
                    f"observed_lengths: got {counts.size} rows, expected one per uid ({len(uids)})"
                )
            if counts.size and counts.min() == 0:
                bad = uids[int(np.argmin(counts))]
                raise ValueError(f"observed_lengths for {bad!r}: got none, expected one length per sample")
            flat = np.fromiter(
                (x for row in observed_lengths for x in row), dtype=float, count=int(counts.sum())
            )
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            obs_max = np.maximum.reduceat(flat, starts) if flat.size else flat
            obs_mean = np.add.reduceat(flat, starts) / counts if flat.size else flat
        unseen = np.flatnonzero(self._from_source(uids)) if planned is not None else None
        self._fit_history(uids, obs_max, obs_mean)
        self.sources.observe(uids, obs_max, obs_mean, cap)
        if planned is not None:
            self._overrun(observed_lengths, planned)
            self.max_ratios = _ratio_quantiles(obs_max, planned, cap) or self.max_ratios
            self.source_ratios = self._source_ratios(uids, obs_max, unseen, cap) or self.source_ratios
        rows = self._rows(uids)
        order = np.arange(rows.size)
        while order.size:  # each pass records at most one observation per row, in input order
            _, first = np.unique(rows[order], return_index=True)
            take = order[np.sort(first)]
            self._push(rows[take], obs_max[take], obs_mean[take])
            order = np.setdiff1d(order, take, assume_unique=True)
        if self._truth:
            for uid in uids:
                self._truth.pop(uid, None)

    def _fit_history(self, uids: Sequence[str], obs_max: np.ndarray, obs_mean: np.ndarray) -> None:
        """Teach the history fits what the seen prompts' histories, before this step, said of it
        beyond what their source would have estimated for them unseen, answers as told (0 where
        a prompt names no source)."""
        if self.mode != "ewma":
            return
        rows = np.fromiter(map(self._row.get, uids, repeat(-1)), dtype=np.int64, count=len(uids))
        seen = rows >= 0
        if seen.any():  # where answers fit a source, they say much of what a history says
            at_max, at_mean, _ = self.sources.hindcast(uids)  # as `predict` estimated them
            at_max, at_mean = at_max[seen], at_mean[seen]
            self.max_fit.observe(self._max[rows[seen]] - at_max, obs_max[seen] - at_max)
            self.mean_fit.observe(self._mean[rows[seen]] - at_mean, obs_mean[seen] - at_mean)

    def _overrun(self, observed_lengths: Any, planned: Sequence[float]) -> None:
        """Keep the step's sample lengths as ratios to their group's planned max, those past 1
        (only they say how far an outlived sequence runs on), as at most `OVERRUN_POINTS`
        quantiles. Kept whole, the tail is what such a sequence meets: from 64 quantiles of every
        ratio, one at 1.2x its prediction on a simulated GPQA-like step was given 86-190 more
        tokens where it ran 33-58; from these, 44-55 (`l40s-q3b-tp1-gpqa-g8-4k`, steps 2-5)."""
        if len(planned) != len(observed_lengths):
            raise ValueError(
                f"planned: got {len(planned)} group maxima, expected one per uid ({len(observed_lengths)})"
            )
        ratios = np.concatenate(
            [
                np.asarray(row, dtype=float) / max(float(p), 1.0)
                for row, p in zip(observed_lengths, planned, strict=True)
            ]
        )
        ratios = ratios[ratios > 1.0]
        if ratios.size > OVERRUN_POINTS:
            ratios = np.quantile(ratios, np.linspace(0.0, 1.0, OVERRUN_POINTS))
        self.overrun = np.sort(ratios).tolist()

    def _source_ratios(
        self, uids: Sequence[str], obs_max: np.ndarray, unseen: np.ndarray, cap: float | None
    ) -> list[float]:
        """`_ratio_quantiles` of the groups planned unseen (positions `unseen`), over what their
        source estimates now, this step's groups folded in: the next unseen prompts take that
        estimate, so their tail is how far a source's groups scatter around it, not how far the
        last estimate missed. A first step planned from a pilot of two groups outran its plan up to
        7-fold, and those ratios put the next step's forecast 2x long (one H100 node, Llama-2-7B
        TP 2, 64 LCB-like prompts of one sample, simulated). Empty where none had a known source."""
        now, _, known = self.sources.hindcast([uids[i] for i in unseen])
        if not known.any():
            return []
        now = np.minimum(now[known], cap) if cap is not None else now[known]
        return _ratio_quantiles(obs_max[unseen[known]], now, cap)

    def _from_source(self, uids: Sequence[str]) -> np.ndarray:
        """Per uid, whether it is predicted from its source: never seen, nor told (`TOLD` modes).
        Membership is mapped, not called per uid: a plan asks it of every prompt."""
        known = np.fromiter(map(self._row.__contains__, uids), dtype=bool, count=len(uids))
        if self.mode in TOLD:
            known |= np.fromiter(map(self._truth.__contains__, uids), dtype=bool, count=len(uids))
        return ~known

    def tail_ratios(self, uids: Sequence[str]) -> list[float]:
        """The ratios a step of `uids` is timed with (`Tail`): `source_ratios` where most of its
        prompts were never seen, once measured; else `max_ratios`."""
        if not self.source_ratios:
            return self.max_ratios
        return self.source_ratios if 2 * int(self._from_source(uids).sum()) > len(uids) else self.max_ratios

    def _push(self, rows: np.ndarray, obs_max: np.ndarray, obs_mean: np.ndarray) -> None:
        """Append one observation to each (distinct) row and refresh its EWMA."""
        obs = self._obs[rows]
        obs[:, :-1] = obs[:, 1:]
        obs[:, -1, 0], obs[:, -1, 1] = obs_max, obs_mean
        self._obs[rows] = obs
        self._count[rows] += np.uint64(1)
        kept = np.minimum(self._count[rows], self.window).astype(np.int64)
        alpha = 2.0 / (self.window + 1)
        smoothed = obs[:, -1].copy()
        for k in range(self.window - 1, -1, -1):  # oldest kept observation starts the average
            col = self.window - k - 1
            starts_here = kept == k + 1
            later = kept > k + 1
            smoothed[starts_here] = obs[starts_here, col]
            smoothed[later] = alpha * obs[later, col] + (1 - alpha) * smoothed[later]
        self._max[rows], self._mean[rows] = smoothed[:, 0], smoothed[:, 1]

    def reveal(self, uid: str, true_lengths: Sequence[int]) -> None:
        """Oracle mode: the lengths the coming step will really produce for `uid`."""
        self._truth[uid] = (float(max(true_lengths)), float(np.mean(true_lengths)))

    def reveal_expected(self, uid: str, group_max: float, group_mean: float) -> None:
        """Expected mode: the coming step's expected group max and mean for `uid`."""
        self._truth[uid] = (float(group_max), float(group_mean))

    def predict(
        self,
        uids: Sequence[str],
        answer_tokens: Sequence[int | None] | None = None,
        sources: Sequence[str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(group max, group mean) predicted response lengths, one entry per uid. `sources` (data
        source or task per uid) are remembered, so that observations teach the source estimate."""
        self.sources.tell(uids, answer_tokens, sources)
        rows = np.fromiter(map(self._row.get, uids, repeat(-1)), dtype=np.int64, count=len(uids))
        seen = rows >= 0
        safe = np.where(seen, rows, 0)
        gmax = np.where(seen, self._max[safe] if self._max.size else 0.0, np.nan)
        gmean = np.where(seen, self._mean[safe] if self._mean.size else 0.0, np.nan)
        fitted = self.mode == "ewma" and seen.any() and not (self.max_fit.identity and self.mean_fit.identity)
        if fitted or not seen.all():
            est_max, est_mean, _ = self.sources.estimate(uids, answer_tokens, sources)
        if fitted:  # a seen prompt on the fits, as its departure from its source's estimate
            named = (
                np.fromiter(map(bool, sources), dtype=bool, count=len(uids))
                if sources
                else np.zeros(len(uids), dtype=bool)
            )
            at_max, at_mean = (np.where(named, est, 0.0)[seen] for est in (est_max, est_mean))
            gmax[seen] = at_max + self.max_fit(gmax[seen] - at_max)
            gmean[seen] = at_mean + self.mean_fit(gmean[seen] - at_mean)
        if not seen.all():
            gmax = np.where(seen, gmax, est_max)
            gmean = np.where(seen, gmean, est_mean)
        if self.mode in TOLD and self._truth:
            for i, uid in enumerate(uids):
                truth = self._truth.get(uid)
                if truth is not None:
                    gmax[i], gmean[i] = truth
        if self.mode == "noisy" and self.noise > 0:
            factor = self._noise_factor(uids, rows, seen)
            gmax, gmean = gmax * factor, gmean * factor
        return np.maximum(gmax, 1.0), np.clip(gmean, 1.0, np.maximum(gmax, 1.0))

    def guessed(
        self,
        uids: Sequence[str],
        answer_tokens: Sequence[int | None] | None = None,
        sources: Sequence[str] | None = None,
    ) -> np.ndarray:
        """Which of `predict`'s figures rest on `default_length` alone: the prompt, its source and
        a fitting answer all unseen. Such a length is a guess, so a forecast's range cannot be a
        factor of it."""
        rows = np.fromiter(map(self._row.get, uids, repeat(-1)), dtype=np.int64, count=len(uids))
        unseen = rows < 0
        if self.mode in TOLD:
            unseen &= np.array([u not in self._truth for u in uids], dtype=bool)
        if not unseen.any():
            return unseen
        return unseen & self.sources.estimate(uids, answer_tokens, sources)[2]

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
        n = len(self._uids)
        kept = np.minimum(self._count[:n], self.window).astype(np.int64).tolist()
        obs = self._obs[:n].tolist()
        return {
            "window": self.window,
            "history": {uid: obs[r][self.window - kept[r] :] for r, uid in enumerate(self._uids)},
            "counts": dict(zip(self._uids, self._count[:n].tolist(), strict=True)),
            "overrun": self.overrun,
            "max_ratios": self.max_ratios,
            "source_ratios": self.source_ratios,
            "history_fit": {"max": self.max_fit.sums, "mean": self.mean_fit.sums},
            **self.sources.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` (older states without `counts` count the kept history)."""
        if int(state["window"]) != self.window:
            raise ValueError(f"window: got {state['window']} in the state, expected {self.window}")
        fresh = LengthPredictor(self.window)
        self._row, self._uids, self._obs = fresh._row, fresh._uids, fresh._obs
        self._max, self._mean, self._count, self._hash = fresh._max, fresh._mean, fresh._count, fresh._hash
        history = {uid: past[-self.window :] for uid, past in state["history"].items() if past}
        for k in range(max(map(len, history.values()), default=0)):
            uids = [u for u, past in history.items() if len(past) > k]
            observed = np.array([history[u][k] for u in uids], dtype=float)
            self._push(self._rows(uids), observed[:, 0], observed[:, 1])
        self.sources.load_state_dict(state)
        self.overrun = [float(r) for r in state.get("overrun", [])]  # older states: none measured
        self.max_ratios = [float(r) for r in state.get("max_ratios", [])]
        self.source_ratios = [float(r) for r in state.get("source_ratios", [])]
        fits = state.get("history_fit", {})  # older states: none fitted, histories taken as they are
        self.max_fit, self.mean_fit = HistoryFit(fits.get("max", [])), HistoryFit(fits.get("mean", []))
        counts = state.get("counts", {})
        if counts:
            rows = self._rows(list(counts))
            self._count[rows] = np.fromiter(counts.values(), dtype=np.uint64, count=len(counts))

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.state_dict()) + "\n")

    def load(self, path: str | Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text()))
