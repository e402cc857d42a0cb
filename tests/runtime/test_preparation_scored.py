"""What learning ahead reads from a step's preparation: the groups whose every sample is scored,
with their rewards, in sample order."""

from types import SimpleNamespace

from rlhfless.config import load_config
from rlhfless.engine.sequences import SequenceResult
from rlhfless.models import load_tokenizer
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
