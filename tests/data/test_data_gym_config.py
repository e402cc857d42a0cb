"""Reasoning-gym prompts and the data config."""

import pickle
from collections import Counter

import pytest

from rlhfless.data import DataConfig, load_prompts
from rlhfless.data.gym import GYM_KEY, task_counts
from rlhfless.data.prompts import make_uid

TASKS = {"spell_backward": 3.0, "chain_sum": 1.0}


def gym_prompts(**kw):
    return load_prompts(DataConfig(tasks=TASKS, task_config={}, size=kw.pop("size", 12), **kw))


def test_mix_follows_weights_with_exact_total():
    assert task_counts({"a": 3.0, "b": 1.0}, 12) == {"a": 9, "b": 3}
    assert sum(task_counts({"a": 1.0, "b": 1.0, "c": 1.0}, 10).values()) == 10
    prompts = gym_prompts()
    assert Counter(p.data_source for p in prompts) == {
        f"{GYM_KEY}/spell_backward": 9,
        f"{GYM_KEY}/chain_sum": 3,
    }


def test_prompts_share_the_system_prompt_and_carry_what_scoring_needs():
    prompts = gym_prompts(system_prompt="SYS", answer_reminder=" [tags]")
    for p in prompts:
        assert p.messages[0] == {"role": "system", "content": "SYS"}
        assert p.messages[1]["role"] == "user"
        info = p.extra_info[GYM_KEY]
        assert info["entry"]["answer"] == p.ground_truth
        assert p.question == info["entry"]["question"] + " [tags]"


def test_same_seed_same_prompts_and_uids_other_seed_differs():
    a, b = gym_prompts(dataset_seed=1), gym_prompts(dataset_seed=1)
    assert [(p.uid, p.messages) for p in a] == [(p.uid, p.messages) for p in b]
    assert len({p.uid for p in a}) == len(a)
    c = gym_prompts(dataset_seed=2)
    assert {p.uid for p in a} != {p.uid for p in c}


def test_prompts_survive_pickling():
    prompts = gym_prompts(size=4)
    assert pickle.loads(pickle.dumps(prompts)) == prompts


def test_default_config_loads_a_mix_of_tasks():
    cfg = DataConfig()
    prompts = load_prompts(cfg)
    assert len(prompts) == cfg.size
    assert len({p.data_source for p in prompts}) >= 3
    assert "<answer>" in cfg.system_prompt and "</answer>" in cfg.system_prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source": "hub"}, "source: got 'hub'"),
        ({"format": "csv"}, "format: got 'csv'"),
        ({"size": 0}, "size: got 0"),
        ({"batch_size": 0}, "batch_size: got 0"),
        ({"source": "file"}, "path: got None"),
        ({"tasks": {}}, "tasks: got {}"),
        ({"tasks": {"spel_backward": 1.0}}, "did you mean 'spell_backward'"),
        ({"tasks": {"chain_sum": -1.0}}, "tasks.chain_sum: got -1.0"),
        ({"tasks": {"chain_sum": 0.0}}, "expected at least one weight > 0"),
        ({"task_config": {"chain_summ": {}}}, "task_config: got 'chain_summ'"),
    ],
)
def test_invalid_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("{", r"\{").replace("}", r"\}")):
        DataConfig(**kwargs)


def test_uid_scheme_is_pinned_so_saved_histories_stay_valid():
    # uids key the length predictor's history in checkpoints: a changed scheme orphans it.
    assert make_uid("src", 0, [{"role": "user", "content": "q"}]) == "a4e123b4eb2a1348"
    assert make_uid("src", 1, [{"role": "user", "content": "q"}]) != "a4e123b4eb2a1348"
