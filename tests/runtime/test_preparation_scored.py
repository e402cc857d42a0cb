"""What learning ahead reads from a step's preparation: the groups whose every sample is scored,
with their rewards, in sample order; and what a preparer loads before its first call."""

import subprocess
import sys
from types import SimpleNamespace

from rlhfless.config import load_config
from rlhfless.engine.sequences import SequenceResult
from rlhfless.models import load_tokenizer
from rlhfless.runtime.lifecycle import Functions
from rlhfless.runtime.preparation import Preparation


def test_a_group_is_scored_once_all_its_samples_are_and_comes_in_sample_order():
    cfg = load_config(preset="tiny", overrides=("algorithm.kl_coef=0",))
    tokenizer = load_tokenizer(cfg.model)
    functions = SimpleNamespace(prep_setup=lambda: None)
    prep = Preparation(cfg, functions, None, tokenizer, [], None, 1, overlap=True, eager=True)
    G = cfg.algorithm.group_size
    prep.add([SequenceResult("a", k, [1, 2], [65 + k], [0.0], "stop") for k in reversed(range(G))])
    prep.add([SequenceResult("b", k, [1, 2], [66], [0.0], "stop") for k in range(G - 1)])
    assert prep.scored() == []  # finished, not scored
    for k in range(G):
        prep.scores[("a", k)] = (float(k), {"correct": float(k)})
    prep.scores.update({("b", k): (1.0, {}) for k in range(G - 1)})
    assert prep.scored() == ["a"]  # b still has a sample decoding
    samples, ref = prep.group("a")
    assert [s.sample for s in samples] == list(range(G)) and ref is None
    assert [s.reward for s in samples] == [float(k) for k in range(G)]
    assert [s.response for s in samples] == [
        tokenizer.decode([65 + k], skip_special_tokens=True) for k in range(G)
    ]


def test_a_prepare_function_for_reasoning_gym_prompts_imports_its_scorers_as_it_starts():
    """The import takes about 0.9 s: paid as the prepare function starts (beside the run's pilot
    and forecast), not in the first step's scoring. A fresh interpreter, as a function's process:
    nothing imported reasoning-gym yet (the config's checks would)."""
    probe = (
        "import sys\n"
        "from rlhfless.rewards import RewardConfig\n"
        "from rlhfless.runtime.functions import PrepareFunction, PrepSetup\n"
        "for gym in (False, True):\n"
        "    PrepareFunction(None, 0, 0, PrepSetup(RewardConfig(), 1.0, 0, 'float32', gym=gym), 1, 'cpu')\n"
        "    print('reasoning_gym' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_runs_prepare_functions_are_told_when_its_prompts_are_reasoning_gyms():
    tokenizer = load_tokenizer(load_config(preset="tiny").model)
    for source, gym in (("reasoning_gym", True), ("file", False)):
        cfg = SimpleNamespace(
            reward=None,
            generation=SimpleNamespace(temperature=1.0),
            model=SimpleNamespace(compute_dtype="float32"),
            data=SimpleNamespace(source=source),
        )
        assert Functions.prep_setup(SimpleNamespace(cfg=cfg, tokenizer=tokenizer)).gym is gym
