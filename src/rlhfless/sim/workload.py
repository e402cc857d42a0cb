"""Per-step prompts and true response lengths for the simulator.

Two sources: synthetic datasets shaped by published length statistics (long-tailed per-prompt
lengths, per-prompt persistence across epochs, a drifting mean, correlated samples within a
group), and traces recorded by real runs (`rollouts/step_*.jsonl`, docs/RUN_DIR.md).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DatasetShape:
    """Length statistics of one dataset under one model (see shared/data/workload_facts.md)."""

    name: str
    mean_response: float  # mean response tokens at the first step, before the cap
    spread: float  # sigma of the log-normal per-prompt mean: the long tail
    prompt_tokens: float  # mean prompt length (question only)
    epoch_noise: float  # sigma of a prompt's log-length change from one epoch to the next
    sample_noise: float  # sigma of one sample's log-length around its prompt's length
    drift_per_100_steps: float  # relative change of the mean length per 100 steps
    answer_ratio: float  # ground-truth answer tokens / response tokens (first-epoch predictor hint)


# GSM8K: mean 306 (Qwen2.5-Math-7B-Instruct); epoch noise set so that ~70% of prompts move by at most
# 50 tokens and ~90% by at most 100 between epochs (the paper's stability statistics, tested).
# GPQA: mean 762, wider. LiveCodeBench: no published mean here; long code answers, heaviest tail.
DATASETS: dict[str, DatasetShape] = {
    "gsm8k": DatasetShape("gsm8k", 306.0, 0.45, 120.0, 0.07, 0.11, 0.20, 0.45),
    "gpqa": DatasetShape("gpqa", 762.0, 0.6, 260.0, 0.07, 0.12, 0.25, 0.15),
    "lcb": DatasetShape("lcb", 900.0, 0.8, 420.0, 0.07, 0.12, 0.30, 0.5),
}
SYSTEM_PROMPT_TOKENS = 48  # chat template + system prompt shared by every prompt


@dataclass(frozen=True)
class LengthLaw:
    """How a step's response lengths were drawn: exp(centre + sigma z) per sample, z standard
    normal, clipped to [1, cap]; `centre` per prompt."""

    centre: np.ndarray
    sigma: float
    cap: float

    def expected(self, samples: int) -> np.ndarray:
        """(prompts, 2): each prompt's expected group max and mean (`expected_lengths`)."""
        return expected_lengths(self.centre, self.sigma, samples, self.cap)


@dataclass
class StepPrompts:
    """One step's prompts: ids, token ids, answer hints and the true lengths of all samples."""

    uids: list[str]
    prompt_tokens: list[np.ndarray]
    answer_tokens: np.ndarray  # per prompt, 0 when unknown
    lengths: np.ndarray  # (prompts, samples) true response tokens, capped
    law: LengthLaw | None = None  # what the lengths were drawn from (None: unknown, e.g. a trace)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.prompt_tokens], dtype=np.int64)

    def subset(self, uids: Iterable[str]) -> StepPrompts:
        """These prompts' rows for `uids` (in that order)."""
        index = {u: i for i, u in enumerate(self.uids)}
        rows = [index[u] for u in uids]
        return StepPrompts(
            [self.uids[i] for i in rows],
            [self.prompt_tokens[i] for i in rows],
            self.answer_tokens[rows],
            self.lengths[rows],
            None if self.law is None else replace(self.law, centre=self.law.centre[rows]),
        )


class SyntheticWorkload:
    """A fixed prompt set sampled without replacement each epoch, lengths persistent per prompt."""

    def __init__(
        self,
        dataset: str | DatasetShape,
        prompts_per_step: int,
        samples: int,
        max_response: int,
        max_prompt: int = 1024,
        dataset_size: int = 0,
        seed: int = 0,
    ) -> None:
        self.shape = DATASETS[dataset] if isinstance(dataset, str) else dataset
        self.prompts_per_step = prompts_per_step
        self.samples = samples
        self.max_response = max_response
        self.size = dataset_size or 4 * prompts_per_step
        if self.size < prompts_per_step:
            raise ValueError(
                f"dataset_size: got {self.size}, expected >= prompts_per_step={prompts_per_step}"
            )
        self.seed = seed
        rng = np.random.default_rng(seed)
        shape = self.shape
        # Log-normal per-prompt base length with the requested mean.
        mu = np.log(shape.mean_response) - shape.spread**2 / 2
        self.base = rng.normal(mu, shape.spread, self.size)
        self.answer = np.maximum(1, np.exp(self.base) * shape.answer_ratio).astype(np.int64)
        plen = np.clip(
            rng.lognormal(np.log(shape.prompt_tokens), 0.35, self.size), 8, max_prompt - SYSTEM_PROMPT_TOKENS
        )
        system = rng.integers(10, 32000, SYSTEM_PROMPT_TOKENS, dtype=np.int32)
        self.tokens = [
            np.concatenate([system, rng.integers(10, 32000, int(n), dtype=np.int32)]) for n in plen
        ]
        self.uids = [f"{shape.name}-{i:06d}" for i in range(self.size)]
        self.steps_per_epoch = self.size // prompts_per_step
        self._epoch_log = np.zeros(self.size)  # log-length offset in the current epoch
        self._epoch = -1

    def _enter_epoch(self, epoch: int) -> None:
        while self._epoch < epoch:  # a random walk: consecutive epochs are close, far ones drift apart
            self._epoch += 1
            rng = np.random.default_rng((self.seed, 1, self._epoch))
            self._epoch_log = 0.5 * self._epoch_log + rng.normal(0, self.shape.epoch_noise, self.size)

    def step(self, step: int) -> StepPrompts:
        """Prompts of step `step` (0-based): epoch order is a fixed shuffle per epoch."""
        epoch, k = divmod(step, self.steps_per_epoch)
        self._enter_epoch(epoch)
        order = np.random.default_rng((self.seed, 2, epoch)).permutation(self.size)
        idx = order[k * self.prompts_per_step : (k + 1) * self.prompts_per_step]
        drift = np.log1p(self.shape.drift_per_100_steps * step / 100)
        rng = np.random.default_rng((self.seed, 3, step))
        centre = self.base[idx] + self._epoch_log[idx] + drift
        log_len = centre[:, None] + rng.normal(0, self.shape.sample_noise, (len(idx), self.samples))
        lengths = np.clip(np.exp(log_len).round(), 1, self.max_response).astype(np.int64)
        return StepPrompts(
            uids=[self.uids[i] for i in idx],
            prompt_tokens=[self.tokens[i] for i in idx],
            answer_tokens=self.answer[idx],
            lengths=lengths,
            law=LengthLaw(centre, self.shape.sample_noise, self.max_response),
        )


def expected_lengths(centre: np.ndarray, sigma: float, samples: int, cap: float) -> np.ndarray:
    """(prompts, 2): the expected max and mean of `samples` lengths exp(centre + sigma z), z
    standard normal, clipped to [1, cap], over a fine grid of z (the max of iid draws has CDF F^n)."""
    z = np.linspace(-8.0, 8.0, 641)
    density = np.exp(-0.5 * z * z)
    cdf = np.cumsum(density) / density.sum()
    one = np.diff(cdf, prepend=0.0)
    most = np.diff(cdf**samples, prepend=0.0)
    lengths = np.clip(np.exp(centre[:, None] + sigma * z), 1.0, cap)
    return np.stack((lengths @ most, lengths @ one), axis=1)


def _word_tokens(text: str) -> np.ndarray:
    """Stand-in token ids for a recorded prompt: equal words, equal ids, so shared prefixes survive."""
    return np.array([zlib.crc32(w.encode()) & 0x7FFFFFFF for w in text.split()], dtype=np.int64)


class TraceWorkload:
    """Steps replayed from a run directory's `rollouts/step_*.jsonl` (cycled when the sim runs longer)."""

    def __init__(self, run_dir: str | Path) -> None:
        files = sorted(Path(run_dir, "rollouts").glob("step_*.jsonl"))
        if not files:
            raise ValueError(f"trace: got {run_dir}, expected a run directory with rollouts/step_*.jsonl")
        self.steps = [self._read(path) for path in files]
        self.samples = self.steps[0].lengths.shape[1]
        self.prompts_per_step = len(self.steps[0].uids)
        self.max_response = int(max(s.lengths.max() for s in self.steps))

    @staticmethod
    def _read(path: Path) -> StepPrompts:
        groups: dict[str, list[int]] = {}
        tokens: dict[str, np.ndarray] = {}
        for line in path.read_text().split("\n"):
            if line.strip():
                row = json.loads(line)
                groups.setdefault(row["uid"], []).append(int(row["response_tokens"]))
                ids = row.get("prompt_ids")  # older runs only have the text
                tokens[row["uid"]] = (
                    np.array(ids, dtype=np.int64) if ids else _word_tokens(row.get("prompt", ""))
                )
        width = max(len(v) for v in groups.values())
        # A group with a missing sample repeats its last one so the step stays rectangular.
        lengths = np.array([v + v[-1:] * (width - len(v)) for v in groups.values()], dtype=np.int64)
        uids = list(groups)
        return StepPrompts(
            uids=uids,
            prompt_tokens=[tokens[u] for u in uids],
            answer_tokens=np.zeros(len(uids), dtype=np.int64),
            lengths=np.maximum(lengths, 1),
        )

    def step(self, step: int) -> StepPrompts:
        return self.steps[step % len(self.steps)]
