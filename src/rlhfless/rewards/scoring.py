"""The reward function: score one (prompt, response) pair, in the trainer or in a Ray worker."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhfless.data.gym import GYM_KEY, create_gym_dataset
from rlhfless.data.prompts import Prompt
from rlhfless.rewards.answers import answers_match, extract_answer, format_score, last_number
from rlhfless.rewards.config import RewardConfig
from rlhfless.rewards.user import RewardError, UserReward, load_user_function

if TYPE_CHECKING:
    from rlhfless.rewards.model import RewardModel


@dataclass
class RewardOutput:
    """The scalar reward and its unweighted parts (`correct`, `format`), for metrics."""

    score: float
    components: dict[str, float]


WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def check_reward_model_dir(path: str) -> None:
    """A reward-model directory holds a readable `config.json` and weights (cheap: nothing loaded)."""
    from rlhfless.inputs import InputError, read_json

    where = Path(path).expanduser()
    if not where.is_dir():
        state = "is a file" if where.exists() else "not found"
        raise RewardError(f"reward.model: {path}: {state}, expected a checkpoint directory with config.json")
    try:
        read_json(where / "config.json", "a Hugging Face model config")
    except InputError as err:
        raise RewardError(f"reward.model: {err}") from None
    if not any(next(where.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise RewardError(
            f"reward.model: {path}: no weights, expected *.safetensors or pytorch_model.bin in the directory"
        )


@dataclass
class RewardFn:
    """Scores responses per `RewardConfig`. Pickles as its config; caches rebuild lazily in each process."""

    cfg: RewardConfig
    _user_fn: UserReward | None = field(default=None, init=False, repr=False)
    _gym_datasets: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _model: RewardModel | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.cfg.function:
            self._user_fn = load_user_function(self.cfg.function)
        if self.cfg.model:  # named now, before a run writes anything; loaded on first use
            check_reward_model_dir(self.cfg.model)

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cfg = state["cfg"]
        self._gym_datasets = {}
        self._user_fn = load_user_function(self.cfg.function) if self.cfg.function else None
        self._model = None

    def __call__(self, prompt: Prompt, response: str) -> RewardOutput:
        return self.score_batch([prompt], [response])[0]

    def score_batch(self, prompts: list[Prompt], responses: list[str]) -> list[RewardOutput]:
        """Scores of many pairs: the reward model (if any) runs over them in batches.

        `score = rule_weight * (correct_weight * correct + format_weight * format)
        + model_weight * model`; components hold the unweighted `correct` (when rule_weight > 0),
        `format` and `model` (with a reward model).
        """
        cfg = self.cfg
        model_scores = self.reward_model()(prompts, responses) if cfg.model else None
        scored = cfg.rule_weight > 0 and self._user_fn is not None
        user_scores = self._user_fn(prompts, responses) if scored else [None] * len(prompts)
        out = []
        for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            components = {"format": format_score(response, cfg.answer_format)}
            score = 0.0
            if cfg.rule_weight > 0:
                components["correct"] = self.correctness(prompt, response, user_scores[i])
                rule = cfg.correct_weight * components["correct"] + cfg.format_weight * components["format"]
                score += cfg.rule_weight * rule
            if model_scores is not None:
                components["model"] = model_scores[i]
                score += cfg.model_weight * model_scores[i]
            out.append(RewardOutput(score=score, components=components))
        return out

    def reward_model(self) -> RewardModel:
        """The reward model, loaded on first use in this process."""
        if self._model is None:
            from rlhfless.rewards.model import RewardModel, RewardModelError  # torch only when used

            try:
                self._model = RewardModel(
                    self.cfg.model, self.cfg.model_batch_size, self.cfg.model_max_tokens
                )
            except RewardModelError as err:
                raise RewardError(str(err)) from err
        return self._model

    def correctness(self, prompt: Prompt, response: str, value: Any = None) -> float:
        """The user function's `value` for the pair if one is configured; else reasoning-gym's own
        scorer or a match against ground_truth.

        An answer found only by the last-number fallback earns `flexible_credit` of the score.
        """
        if self._user_fn is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise RewardError(
                    f"reward.function {self.cfg.function}: returned {value!r}, expected a finite float"
                )
            return float(value)
        answer, credit = extract_answer(response, self.cfg.answer_format), 1.0
        if answer is None and self.cfg.flexible_credit > 0:
            answer, credit = last_number(response), self.cfg.flexible_credit
        info = prompt.extra_info.get(GYM_KEY)
        if isinstance(info, dict):
            return credit * self._gym_score(info, answer)
        if prompt.ground_truth is None:
            raise _no_answer(prompt)
        return credit if answers_match(answer, prompt.ground_truth) else 0.0

    def _gym_score(self, info: dict[str, Any], answer: str | None) -> float:
        key = json.dumps([info["task"], info["config"], info["seed"], info["size"]], sort_keys=True)
        dataset = self._gym_datasets.get(key)
        if dataset is None:
            dataset = create_gym_dataset(info["task"], info["config"], info["seed"], info["size"])
            self._gym_datasets[key] = dataset
        entry = info.get("entry") or dataset[info["index"]]
        try:
            return float(dataset.score_answer(answer, entry))
        except Exception:
            # Some task scorers raise on malformed answers instead of returning 0.
            return 0.0


def check_scorable(cfg: RewardConfig, prompts: list[Prompt]) -> None:
    """Before any work: every prompt the rule reward scores has what it scores against (a ground
    truth, or reasoning-gym's entry), where no `reward.function` scores it; found only when its
    first response was scored, such a row stopped a run after its forecast (and a held-out one
    after training)."""
    if cfg.rule_weight <= 0 or cfg.function:
        return
    for p in prompts:
        if p.ground_truth is None and not isinstance(p.extra_info.get(GYM_KEY), dict):
            raise _no_answer(p)


def _no_answer(p: Prompt) -> RewardError:
    """The refusal of a prompt the rule reward cannot score: it has no answer to match."""
    where = p.origin or f"prompt {p.uid} ({p.data_source})"
    return RewardError(
        f"{where}: no ground_truth (an answer) to score responses against; expected an answer "
        "column, reward.function, or reward.rule_weight=0 with a reward.model"
    )


def build_reward_fn(cfg: RewardConfig) -> RewardFn:
    return RewardFn(cfg)
