"""The reward function over reasoning-gym prompts, file prompts and user functions."""

import math
import pickle
import sys

import pytest

from rlhfless.data import DataConfig, Prompt, load_prompts
from rlhfless.rewards import RewardConfig, RewardError, build_reward_fn


def file_prompt(truth="1000"):
    return Prompt(
        uid="u",
        messages=[{"role": "user", "content": "q"}],
        ground_truth=truth,
        data_source="f",
        extra_info={},
    )


@pytest.fixture(scope="module")
def spell_prompt():
    cfg = DataConfig(tasks={"spell_backward": 1.0}, task_config={}, size=1)
    return load_prompts(cfg)[0]


def test_reasoning_gym_prompt_scored_by_its_own_scorer(spell_prompt):
    fn = build_reward_fn(RewardConfig(format_weight=0.2))
    truth = spell_prompt.ground_truth
    right = fn(spell_prompt, f"<answer>{truth}</answer>")
    assert right.components == {"correct": 1.0, "format": 1.0}
    assert right.score == pytest.approx(1.2)
    # spell_backward's scorer gives partial credit for a matching prefix
    partial = fn(spell_prompt, f"<answer>{truth[:-1]}X</answer>")
    assert 0.0 < partial.components["correct"] < 1.0
    assert fn(spell_prompt, "no idea").score == 0.0


def test_reasoning_gym_entry_is_regenerated_when_not_stored(spell_prompt):
    info = {k: v for k, v in spell_prompt.extra_info["reasoning_gym"].items() if k != "entry"}
    bare = Prompt(
        spell_prompt.uid, spell_prompt.messages, None, spell_prompt.data_source, {"reasoning_gym": info}
    )
    fn = build_reward_fn(RewardConfig(format_weight=0.0))
    assert fn(bare, f"<answer>{spell_prompt.ground_truth}</answer>").score == 1.0


def test_file_prompt_numeric_match_and_format_weight():
    fn = build_reward_fn(RewardConfig(format_weight=0.1))
    assert fn(file_prompt(), "<answer>1,000</answer>").score == pytest.approx(1.1)
    assert fn(file_prompt(), "<answer>999</answer>").score == pytest.approx(0.1)
    assert fn(file_prompt(), "<answer>1000").components == {"correct": 1.0, "format": 0.5}
    unweighted = build_reward_fn(RewardConfig(format_weight=0.0))(file_prompt(), "<answer>5</answer>")
    assert unweighted.score == 0.0
    assert unweighted.components == {"correct": 0.0, "format": 1.0}


def test_untagged_last_number_earns_the_flexible_share():
    flexible = build_reward_fn(RewardConfig(format_weight=0.1, flexible_credit=0.5))
    out = flexible(file_prompt(), "So the total is 1000 apples.")
    assert out.components == {"format": 0.0, "correct": 0.5}
    assert out.score == pytest.approx(0.5)
    assert flexible(file_prompt(), "It is 1000, no wait, 999.").score == 0.0
    # a tagged answer is never second-guessed by the fallback
    assert flexible(file_prompt(), "1000 <answer>7</answer>").components["correct"] == 0.0
    strict = build_reward_fn(RewardConfig(format_weight=0.1, flexible_credit=0.0))
    assert strict(file_prompt(), "So the total is 1000 apples.").score == 0.0


def test_boxed_format():
    fn = build_reward_fn(RewardConfig(answer_format="boxed", format_weight=0.0))
    assert fn(file_prompt("3/4"), r"so \boxed{0.75}").score == 1.0


def test_file_prompt_without_ground_truth_needs_a_function():
    with pytest.raises(RewardError, match="no ground_truth"):
        build_reward_fn(RewardConfig())(file_prompt(None), "<answer>1</answer>")


def length_reward(prompt, response):
    return len(response) / 10


def bad_reward(prompt, response):
    return math.nan


def test_user_function_replaces_correctness_and_survives_pickling(monkeypatch):
    monkeypatch.setitem(sys.modules, "my_rewards", sys.modules[__name__])
    fn = build_reward_fn(RewardConfig(function="my_rewards:length_reward", format_weight=0.0))
    clone = pickle.loads(pickle.dumps(fn))
    out = clone(file_prompt(None), "x" * 5)
    assert out.score == 0.5
    assert out.components == {"correct": 0.5, "format": 0.0}


def test_user_function_must_return_a_finite_number(monkeypatch):
    monkeypatch.setitem(sys.modules, "my_rewards", sys.modules[__name__])
    fn = build_reward_fn(RewardConfig(function="my_rewards:bad_reward"))
    with pytest.raises(RewardError, match="returned nan"):
        fn(file_prompt(), "x")


VERL_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    hit = solution_str.strip() == ground_truth
    return {"score": 1.0 if hit else 0.25, "acc": hit, "source": data_source, "info": extra_info}
"""


def test_a_verl_compute_score_file_is_called_with_verl_s_arguments_and_dict_result(tmp_path):
    """VERL's `custom_reward_function.path` file and `compute_score` signature, unchanged."""
    path = tmp_path / "my_reward.py"
    path.write_text(VERL_REWARD)
    fn = build_reward_fn(RewardConfig(function=f"{path}:compute_score", format_weight=0.0))
    clone = pickle.loads(pickle.dumps(fn))  # as a Ray worker receives it
    assert clone(file_prompt("1000"), " 1000 ").score == 1.0
    assert clone(file_prompt("1000"), "999").components == {"correct": 0.25, "format": 0.0}


TRL_REWARD = """
seen = {}

def accuracy_reward(prompts, completions, solution, **kwargs):
    seen.update(prompts=prompts, completions=completions, solution=solution, **kwargs)
    contents = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [None if s is None else float(c.strip() == s) for c, s in zip(contents, solution)]
"""


def test_a_trl_reward_function_gets_the_batch_in_trl_s_convention(tmp_path, monkeypatch):
    """TRL's `f(prompts, completions, solution, **kwargs) -> list`: completions as messages where
    the prompt was, every data column as a keyword, None counting 0."""
    (tmp_path / "trl_reward.py").write_text(TRL_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = tmp_path / "trl.jsonl"
    rows.write_text(
        '{"prompt": "Name a colour.", "solution": "red", "level": 1}\n'
        '{"prompt": [{"role": "user", "content": "2+5?"}], "solution": "7", "level": 2}\n'
        '{"prompt": "Write a haiku."}\n'
    )
    cfg = DataConfig(source="file", path=str(rows), batch_size=1, system_prompt="")
    prompts = load_prompts(cfg)
    fn = build_reward_fn(RewardConfig(function="trl_reward:accuracy_reward", format_weight=0.0))
    outs = fn.score_batch(prompts, ["red", " 7 ", "an old pond"])
    assert [o.score for o in outs] == [1.0, 1.0, 0.0]
    seen = sys.modules["trl_reward"].seen
    assert seen["prompts"] == ["Name a colour.", [{"role": "user", "content": "2+5?"}], "Write a haiku."]
    assert seen["completions"] == ["red", [{"role": "assistant", "content": " 7 "}], "an old pond"]
    assert (seen["solution"], seen["level"]) == (["red", "7", None], [1, 2, None])


def test_a_trl_reward_function_must_score_every_completion(tmp_path):
    path = tmp_path / "short.py"
    path.write_text("def f(completions, **kwargs):\n    return [1.0]\n")
    fn = build_reward_fn(RewardConfig(function=f"{path}:f"))
    with pytest.raises(RewardError, match="returned 1 values for 2 completions"):
        fn.score_batch([file_prompt(), file_prompt()], ["a", "b"])


def test_a_user_function_file_that_is_missing_is_named(tmp_path):
    with pytest.raises(RewardError, match=r"cannot import module '.*nowhere.py'.*no such file"):
        build_reward_fn(RewardConfig(function=f"{tmp_path / 'nowhere.py'}:compute_score"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("math:no_such", "no callable 'no_such'"),
    ],
)
def test_unimportable_user_function_is_a_clear_error(spec, message):
    with pytest.raises(RewardError, match=message):
        build_reward_fn(RewardConfig(function=spec))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answer_format": "xml"}, "answer_format: got 'xml'"),
        ({"format_weight": -0.1}, "format_weight: got -0.1"),
        ({"correct_weight": math.inf}, "correct_weight: got inf"),
        ({"flexible_credit": 1.5}, "flexible_credit: got 1.5"),
        ({"function": "no_colon"}, "function: got 'no_colon'"),
    ],
)
def test_invalid_reward_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardConfig(**kwargs)


def test_a_trl_reward_function_without_kwargs_gets_only_what_it_names(tmp_path):
    path = tmp_path / "named.py"
    path.write_text(
        "def f(completions, solution):\n    return [float(c == s) for c, s in zip(completions, solution)]\n"
    )
    fn = build_reward_fn(RewardConfig(function=f"{path}:f", format_weight=0.0))
    assert [o.score for o in fn.score_batch([file_prompt("a"), file_prompt("b")], ["a", "c"])] == [1.0, 0.0]
