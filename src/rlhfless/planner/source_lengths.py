"""What a data source's groups say of its prompts never seen: the length predictor's first sight.

A prompt never seen whose data source (or task) has been seen takes, as its group max, the quantile
of that source's recent group maxima that the step's longest of n such prompts reaches
(n / (n + 1)): an actor's time follows its longest sequence, so one mean for all would miss the
stragglers. As its group mean it takes the source's mean length, an EWMA over steps
(`SOURCE_ALPHA`): responses lengthen or shorten as the policy trains, and a mean over every group
seen lags that drift. Where the prompts' ground-truth answers have been seen to fit the source's
responses within `ANSWER_FIT`, and better than that one length for all (`ANSWER_GAIN`), judged on at
least `ANSWER_GROUPS` of its groups (two can fit by chance), the answer stands in instead, times the
ratio of group length to answer length learned from the source's groups: it ranks the prompts,
where the quantile gives every one the same length. Each EWMA weighs
a step's groups by `SOURCE_ALPHA`, or by their share of all the source's groups so far where that is
more: the length pilot's few groups would otherwise count as much as the first step's many. A worked
solution (GSM8K's answer field) grows with the reasoning a response needs; reasoning-gym's answers
are a number or a word, whose length says nothing of the response's, so there they never fit. A
prompt naming no source takes its answer's length times `answer_length_factor`; a source never
seen, the default (the planner caps it at max_new_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

import numpy as np

from rlhfless.planner.smoothing import ewma

SOURCE_ALPHA = 0.5  # weight of a step's observations in a source's ratios, their errors and mean length
SOURCE_RECENT = 1024  # a source's latest group (max, mean) pairs that unseen prompts are estimated from
ANSWER_FIT = 0.25  # the answer stand-in is used for a source whose groups it predicts within 25%,
ANSWER_GAIN = 0.5  # and with at most half the error of the source's one length for all,
ANSWER_GROUPS = 3  # judged on at least this many of its groups (not at the cap): two comparisons


class SourceLengths:
    """Per data source: its recent groups, its mean length, and its answers' learned ratio."""

    def __init__(self, default_length: int = 256, answer_length_factor: float = 1.0) -> None:
        self.default_length = default_length
        self.answer_length_factor = answer_length_factor
        self._source_of: dict[str, str] = {}  # uid -> source, as told by `tell`
        self._answer_of: dict[str, float] = {}  # uid -> answer tokens, as told by `tell`
        self._ratio: dict[str, np.ndarray] = {}  # source -> log (group max, mean) / (answer, 1), EWMA
        self._errors: dict[str, np.ndarray] = {}  # source -> those two ratios' relative errors, EWMA
        self._recent: dict[str, np.ndarray] = {}  # source -> its latest (group max, mean) rows
        self._source_mean: dict[str, float] = {}  # source -> its groups' mean length (EWMA over steps)
        self._groups: dict[str, np.ndarray] = {}  # source -> groups folded in: all, answered

    def tell(
        self, uids: Sequence[str], answer_tokens: Sequence[int | None] | None, sources: Sequence[str] | None
    ) -> None:
        """Remember each uid's source and answer, so that its observed lengths teach its source."""
        if sources is None or not any(sources):  # answers matter only for a named source's fit
            return
        self._source_of.update((u, s) for u, s in zip(uids, sources, strict=True) if s)
        if answer_tokens is not None:
            self._answer_of.update(
                (u, float(a))
                for u, a, s in zip(uids, answer_tokens, sources, strict=True)
                if s and a is not None
            )

    def observe(
        self, uids: Sequence[str], obs_max: np.ndarray, obs_mean: np.ndarray, cap: float | None = None
    ) -> None:
        """Fold one step's group lengths into each source's estimate (uids whose source is known).
        `cap`: the response cap; a group that reached it teaches no answer ratio."""
        by_source: dict[str, list[int]] = {}
        for i, uid in enumerate(uids):
            source = self._source_of.get(uid)
            if source is not None:
                by_source.setdefault(source, []).append(i)
        for source, idx in by_source.items():
            pairs = np.stack((obs_max[idx], obs_mean[idx]), axis=1).astype(float)
            old = self._recent.get(source)
            self._recent[source] = (pairs if old is None else np.concatenate((old, pairs)))[-SOURCE_RECENT:]
            answers = np.array([self._answer_of.get(uids[i], np.nan) for i in idx])
            has = (answers > 0) & (pairs[:, 0] < (cap or np.inf))  # NaN (no answer) compares false
            seen = self._groups.get(source, np.zeros(2))
            new = np.array([len(idx), has.sum()], dtype=float)
            self._groups[source] = seen + new
            alpha = np.maximum(SOURCE_ALPHA, new / np.maximum(seen + new, 1.0))  # all, answered
            step_mean = float(pairs[:, 1].mean())
            self._source_mean[source] = ewma(self._source_mean.get(source), step_mean, float(alpha[0]))
            if has.any():
                self._observe_answers(source, answers[has], pairs[has], float(alpha[1]))

    def _observe_answers(self, source: str, answers: np.ndarray, pairs: np.ndarray, alpha: float) -> None:
        """Fold one step's answered groups of `source` into its learned ratios and their errors
        (EWMA weight `alpha`): the answer's (group length over answer length) and, to beat, the
        flat one's (every prompt the source's one length, as an answer of 1 token would give)."""
        logs = np.log(np.maximum(pairs, 1.0))  # (groups, (max, mean))
        fits = np.stack((logs - np.log(answers)[:, None], logs))  # (answer, flat), groups, (max, mean)
        old = self._ratio.get(source)
        scales = np.stack((answers, np.ones_like(answers)))
        errors = _judged_errors(fits, old, scales, pairs[:, 1], alpha)
        if errors is not None:
            self._errors[source] = ewma(self._errors.get(source), errors, alpha)
        self._ratio[source] = ewma(old, fits.mean(axis=1), alpha)

    def estimate(
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

    def hindcast(self, uids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(group max, group mean `estimate` gives now, whether the uid's source is known; 0 where
        not) for uids told with a source, their answers as told: what an unseen prompt like each
        would be planned with."""
        known = np.fromiter(map(self._source_of.__contains__, uids), dtype=bool, count=len(uids))
        named = list(compress(uids, known))
        out_max, out_mean = np.zeros(len(uids)), np.zeros(len(uids))
        if named:
            answers = [self._answer_of.get(u) for u in named]
            est_max, est_mean, _ = self.estimate(named, answers, [self._source_of[u] for u in named])
            out_max[known], out_mean[known] = est_max, est_mean
        return out_max, out_mean, known

    def answers_fit(self, source: str) -> bool:
        """Whether `source`'s answers stand in for its unseen prompts' lengths: their learned ratio
        has fitted its groups within `ANSWER_FIT`, with at most `ANSWER_GAIN` of the error of the
        source's one length for all, judged on `ANSWER_GROUPS` groups or more. Fewer fit by chance:
        the default run's chain_sum, whose answers are one or two tokens, was judged on its one
        group short of the cap and the length pilot's, then predicted 11 tokens for a group that
        ran to 160 (its step's decode tokens forecast 31% short; one length for all: 14%)."""
        errors = self._errors.get(source)
        judged = self._groups.get(source, np.zeros(2))[1]
        return (
            errors is not None
            and judged >= ANSWER_GROUPS
            and bool(errors[0] <= min(ANSWER_FIT, ANSWER_GAIN * errors[1]))
        )

    def answer_errors(self) -> dict[str, tuple[float, float]]:
        """Per source: the answer ratio's and the one length's relative errors on its groups (EWMA)."""
        return {source: (float(e[0]), float(e[1])) for source, e in self._errors.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": {k: v.tolist() for k, v in self._recent.items()},
            "answer_ratio": {k: v.tolist() for k, v in self._ratio.items()},
            "answer_errors": {k: v.tolist() for k, v in self._errors.items()},
            "source_mean": dict(self._source_mean),
            "source_of": dict(self._source_of),
            "groups": {k: v.tolist() for k, v in self._groups.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` (the length predictor's, whose keys these are; missing ones empty)."""
        self._recent = {
            k: np.array(v, dtype=float).reshape(-1, 2) for k, v in state.get("recent", {}).items()
        }
        self._ratio = {k: np.array(v, dtype=float) for k, v in state.get("answer_ratio", {}).items()}
        self._errors = {k: np.array(v, dtype=float) for k, v in state.get("answer_errors", {}).items()}
        self._source_mean = {k: float(v) for k, v in state.get("source_mean", {}).items()}
        self._source_of = dict(state.get("source_of", {}))
        # A state saved before group counts were kept: its steps weigh SOURCE_ALPHA, as they did.
        recent = {k: [SOURCE_RECENT, SOURCE_RECENT] for k in self._recent}
        self._groups = {k: np.array(v, dtype=float) for k, v in state.get("groups", recent).items()}


def _judged_errors(
    fits: np.ndarray, old: np.ndarray | None, scales: np.ndarray, mean: np.ndarray, alpha: float
) -> np.ndarray | None:
    """Each of the step's (ratio, scale) fits' mean relative error on the groups' mean lengths,
    every group judged by the ratio learned without it: the earlier steps' (`old`) blended, with
    the step's weight `alpha`, with the step's other groups. A ratio fitted to the group it judges
    would fit one group perfectly, so a lone group with nothing learned before it is judged by
    nothing (None)."""
    n = fits.shape[1]
    if n > 1:
        others = (fits.sum(axis=1, keepdims=True) - fits) / (n - 1)
        judge = others if old is None else alpha * others + (1.0 - alpha) * old[:, None]
    elif old is not None:
        judge = old[:, None]
    else:
        return None
    mean = np.maximum(mean, 1.0)
    return np.mean(np.abs(mean - scales * np.exp(judge[..., 1])) / mean, axis=1)
