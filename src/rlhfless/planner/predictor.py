"""Per-prompt response-length prediction and its quality statistics.

A prompt is sampled again every epoch and its response length is stable across steps, so the
prediction is an EWMA over the prompt's last `window` observations (window 1 = last observation).
With G samples per prompt the planner needs the group's max (when the group finishes) and mean
(how much work it is), so both are tracked.

A prompt never seen whose data source (or task) has been seen takes, as its group max, the quantile
of that source's recent group maxima that the step's longest of n such prompts reaches
(n / (n + 1)): an actor's time follows its longest sequence, so one mean for all would miss the
stragglers. As its group mean it takes the source's mean length, an EWMA over steps
(`SOURCE_ALPHA`): responses lengthen or shorten as the policy trains, and a mean over every group
seen lags that drift. Where the prompts' ground-truth answers have been seen to fit the source's
responses within `ANSWER_FIT`, and better than that one length for all (`ANSWER_GAIN`), the answer
stands in instead, times the ratio of group length to answer length learned from the source's
groups: it ranks the prompts, where the quantile gives every one the same length. A worked
solution (GSM8K's answer field) grows with the reasoning a response needs; reasoning-gym's answers
are a number or a word, whose length says nothing of the response's, so there they never fit. A
prompt naming no source takes its answer's length times `answer_length_factor`; a source never
seen, the default (the planner caps it at max_new_tokens).

Modes: `ewma`; `oracle` (told the true lengths of the coming step via `reveal`); `noisy` (EWMA
times a deterministic log-normal factor, for sensitivity studies: the same state and uids always
give the same predictions).
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
from rlhfless.planner.config import SchedulerConfig
from rlhfless.planner.smoothing import ewma

MODES = ("ewma", "oracle", "noisy")
SOURCE_ALPHA = 0.5  # weight of a step's observations in a source's ratios, their errors and mean length
SOURCE_RECENT = 1024  # a source's latest group (max, mean) pairs that unseen prompts are estimated from
ANSWER_FIT = 0.25  # the answer stand-in is used for a source whose groups it predicts within 25%,
ANSWER_GAIN = 0.5  # and with at most half the error of the source's one length for all
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
        self._row: dict[str, int] = {}
        self._uids: list[str] = []
        self._obs = np.zeros((0, window, 2))  # [row, k, (max, mean)], most recent at k = window - 1
        self._max = np.zeros(0)
        self._mean = np.zeros(0)
        self._count = np.zeros(0, dtype=np.uint64)
        self._hash = np.zeros(0, dtype=np.uint64)
        self._truth: dict[str, tuple[float, float]] = {}
        self._source_of: dict[str, str] = {}  # uid -> source, as told by `predict`
        self._answer_of: dict[str, float] = {}  # uid -> answer tokens, as told by `predict`
        self._ratio: dict[str, np.ndarray] = {}  # source -> log (group max, mean) / (answer, 1), EWMA
        self._errors: dict[str, np.ndarray] = {}  # source -> those two ratios' relative errors, EWMA
        self._recent: dict[str, np.ndarray] = {}  # source -> its latest (group max, mean) rows
        self._source_mean: dict[str, float] = {}  # source -> its groups' mean length (EWMA over steps)

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

    def update(self, uid: str, observed_lengths: Sequence[int]) -> None:
        """Record the response lengths (one per sample) this step produced for `uid`."""
        if len(observed_lengths) == 0:
            raise ValueError(f"observed_lengths for {uid!r}: got none, expected one length per sample")
        obs_max, obs_mean = np.array([max(observed_lengths)], float), np.array([np.mean(observed_lengths)])
        self._observe_sources([uid], obs_max, obs_mean)
        self._push(self._rows([uid]), obs_max, obs_mean)
        self._truth.pop(uid, None)

    def update_many(self, uids: Sequence[str], observed_lengths: Any, cap: float | None = None) -> None:
        """`update` for many uids at once: `observed_lengths` is a (uids, samples) array or one
        sequence of lengths per uid. A uid listed twice is recorded twice, in order. `cap`: the
        response cap they were sampled under; a group that reached it says only that its length is
        at least the cap, so it teaches no answer ratio."""
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
        self._observe_sources(uids, obs_max, obs_mean, cap)
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

    def _observe_sources(
        self, uids: Sequence[str], obs_max: np.ndarray, obs_mean: np.ndarray, cap: float | None = None
    ) -> None:
        """Fold one step's group lengths into each source's estimate (uids whose source is known)."""
        by_source: dict[str, list[int]] = {}
        for i, uid in enumerate(uids):
            source = self._source_of.get(uid)
            if source is not None:
                by_source.setdefault(source, []).append(i)
        for source, idx in by_source.items():
            pairs = np.stack((obs_max[idx], obs_mean[idx]), axis=1).astype(float)
            old = self._recent.get(source)
            self._recent[source] = (pairs if old is None else np.concatenate((old, pairs)))[-SOURCE_RECENT:]
            step_mean = float(pairs[:, 1].mean())
            self._source_mean[source] = ewma(self._source_mean.get(source), step_mean, SOURCE_ALPHA)
            answers = np.array([self._answer_of.get(uids[i], np.nan) for i in idx])
            has = (answers > 0) & (pairs[:, 0] < (cap or np.inf))  # NaN (no answer) compares false
            if has.any():
                self._observe_answers(source, answers[has], pairs[has])

    def _observe_answers(self, source: str, answers: np.ndarray, pairs: np.ndarray) -> None:
        """Fold one step's answered groups of `source` into its learned ratios and their errors: the
        answer's (group length over answer length) and, to beat, the flat one's (every prompt the
        source's one length, as an answer of 1 token would give)."""
        logs = np.log(np.maximum(pairs, 1.0))  # (groups, (max, mean))
        fits = np.stack((logs - np.log(answers)[:, None], logs))  # (answer, flat), groups, (max, mean)
        old = self._ratio.get(source)
        errors = _judged_errors(fits, old, np.stack((answers, np.ones_like(answers))), pairs[:, 1])
        if errors is not None:
            self._errors[source] = ewma(self._errors.get(source), errors, SOURCE_ALPHA)
        self._ratio[source] = ewma(old, fits.mean(axis=1), SOURCE_ALPHA)

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

    def predict(
        self,
        uids: Sequence[str],
        answer_tokens: Sequence[int | None] | None = None,
        sources: Sequence[str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(group max, group mean) predicted response lengths, one entry per uid. `sources` (data
        source or task per uid) are remembered, so that observations teach the source estimate."""
        if sources is not None and any(sources):  # answers matter only for a named source's fit
            self._source_of.update((u, s) for u, s in zip(uids, sources, strict=True) if s)
            if answer_tokens is not None:
                self._answer_of.update(
                    (u, float(a))
                    for u, a, s in zip(uids, answer_tokens, sources, strict=True)
                    if s and a is not None
                )
        rows = np.fromiter(map(self._row.get, uids, repeat(-1)), dtype=np.int64, count=len(uids))
        seen = rows >= 0
        safe = np.where(seen, rows, 0)
        gmax = np.where(seen, self._max[safe] if self._max.size else 0.0, np.nan)
        gmean = np.where(seen, self._mean[safe] if self._mean.size else 0.0, np.nan)
        if not seen.all():
            fallback_max, fallback_mean, _ = self._first_sight(uids, answer_tokens, sources)
            gmax = np.where(seen, gmax, fallback_max)
            gmean = np.where(seen, gmean, fallback_mean)
        if self.mode == "oracle" and self._truth:
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
        if self.mode == "oracle":
            unseen &= np.array([u not in self._truth for u in uids], dtype=bool)
        if not unseen.any():
            return unseen
        return unseen & self._first_sight(uids, answer_tokens, sources)[2]

    def _first_sight(
        self,
        uids: Sequence[str],
        answer_tokens: Sequence[int | None] | None,
        sources: Sequence[str] | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(max, mean, whether it is the default) for prompts never seen: the answer's length times
        the source's learned ratios where answers fit it (times `answer_length_factor` where the
        prompt names no source), else a draw from the source's recent groups, else the default."""
        n = len(uids)
        # As floats, None (no answer) is NaN.
        answers = np.array(answer_tokens, dtype=float) if answer_tokens is not None else np.full(n, np.nan)
        out_max = np.full(n, float(self.default_length))
        out_mean = out_max.copy()
        default = np.ones(n, dtype=bool)
        names = list(sources) if sources is not None else [""] * n
        kinds = set(names)
        for source in kinds:
            idx = (
                np.arange(n)
                if len(kinds) == 1
                else np.array([i for i, name in enumerate(names) if name == source])
            )
            recent = self._recent.get(source) if source else None
            fits = self.answers_fit(source)
            use_answer = (answers[idx] > 0) & (fits or not source)  # NaN (no answer) compares false
            if recent is not None:
                # The step waits for its longest group: of n unseen prompts, expect the n/(n+1) quantile.
                out_max[idx] = np.quantile(recent[:, 0], idx.size / (idx.size + 1.0))
                out_mean[idx] = self._source_mean.get(source, float(recent[:, 1].mean()))
                default[idx] = False
            answered = idx[use_answer]
            ratio = np.exp(self._ratio[source][0]) if fits else np.full(2, self.answer_length_factor)
            out_max[answered], out_mean[answered] = answers[answered] * ratio[0], answers[answered] * ratio[1]
            default[answered] = False
        return out_max, out_mean, default

    def answers_fit(self, source: str) -> bool:
        """Whether `source`'s answers stand in for its unseen prompts' lengths: their learned ratio
        has fitted its groups within `ANSWER_FIT`, with at most `ANSWER_GAIN` of the error of the
        source's one length for all."""
        errors = self._errors.get(source)
        return errors is not None and bool(errors[0] <= min(ANSWER_FIT, ANSWER_GAIN * errors[1]))

    def answer_errors(self) -> dict[str, tuple[float, float]]:
        """Per source: the answer ratio's and the one length's relative errors on its groups (EWMA)."""
        return {source: (float(e[0]), float(e[1])) for source, e in self._errors.items()}

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
            "recent": {k: v.tolist() for k, v in self._recent.items()},
            "answer_ratio": {k: v.tolist() for k, v in self._ratio.items()},
            "answer_errors": {k: v.tolist() for k, v in self._errors.items()},
            "source_mean": dict(self._source_mean),
            "source_of": dict(self._source_of),
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
        self._recent = {
            k: np.array(v, dtype=float).reshape(-1, 2) for k, v in state.get("recent", {}).items()
        }
        self._ratio = {k: np.array(v, dtype=float) for k, v in state.get("answer_ratio", {}).items()}
        self._errors = {k: np.array(v, dtype=float) for k, v in state.get("answer_errors", {}).items()}
        self._source_mean = {k: float(v) for k, v in state.get("source_mean", {}).items()}
        self._source_of = dict(state.get("source_of", {}))
        counts = state.get("counts", {})
        if counts:
            rows = self._rows(list(counts))
            self._count[rows] = np.fromiter(counts.values(), dtype=np.uint64, count=len(counts))

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.state_dict()) + "\n")

    def load(self, path: str | Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text()))


def _judged_errors(
    fits: np.ndarray, old: np.ndarray | None, scales: np.ndarray, mean: np.ndarray
) -> np.ndarray | None:
    """Each of the step's (ratio, scale) fits' mean relative error on the groups' mean lengths,
    every group judged by the ratio learned without it: the earlier steps' (`old`) blended with the
    step's other groups. A ratio fitted to the group it judges would fit one group perfectly, so a
    lone group with nothing learned before it is judged by nothing (None)."""
    n = fits.shape[1]
    if n > 1:
        others = (fits.sum(axis=1, keepdims=True) - fits) / (n - 1)
        judge = others if old is None else SOURCE_ALPHA * others + (1.0 - SOURCE_ALPHA) * old[:, None]
    elif old is not None:
        judge = old[:, None]
    else:
        return None
    mean = np.maximum(mean, 1.0)
    return np.mean(np.abs(mean - scales * np.exp(judge[..., 1])) / mean, axis=1)


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
