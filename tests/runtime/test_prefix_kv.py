"""The plan's prefix tree through the runtime's own path, without Ray: the learner's engine
computes each level once, the bundle travels pickled (as through the object store) and decode
functions start each prompt from its node's levels. Tokens equal those without dedup, under the
tree and the paper's rule, on one function or several; the tokens computed are the plan's."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM

from rlhfless.engine import Engine, SamplingParams, rollout
from rlhfless.planner import ClusterSpec, LengthPredictor, PromptSpec, SchedulerConfig, plan_step
from rlhfless.planner.hardware import ModelShape, roofline_profile
from rlhfless.runtime.functions import DecodeFunction
from rlhfless.runtime.prefixes import prefill_metrics, prefix_tree
from rlhfless.runtime.samples import StepPrompt
from rlhfless.runtime.transfer import KVBundle
from tests.engine.engine_support import small_llama

EOS = list(range(1, 9))
PARAMS = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, seed=5)
GROUP = 3
SYSTEM = list(range(20, 32))  # shared by every prompt but the last
TASKS = ([40, 41, 42, 43], [50, 51])  # a second level: two tasks' instructions
PROMPTS = [
    *(SYSTEM + TASKS[0] + [60 + i, 70 + i] for i in range(3)),
    *(SYSTEM + TASKS[1] + [80 + i] for i in range(3)),
    SYSTEM + TASKS[1],  # the second level is this whole prompt
    SYSTEM + [90, 91, 92],
    [100, 101, 102, 103],  # shares nothing
]


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return small_llama(128, 256)


def engine(model) -> Engine:
    return Engine(model, eos_token_ids=EOS, pad_token_id=0)


def step_prompts() -> list[StepPrompt]:
    return [StepPrompt(SimpleNamespace(uid=f"u{i}"), "", ids) for i, ids in enumerate(PROMPTS)]


def make_plan(**scheduler):
    shape = ModelShape.resolve("qwen2.5-3b")
    specs = [PromptSpec(p.uid, p.prompt_ids) for p in step_prompts()]
    return plan_step(
        specs,
        LengthPredictor(),
        roofline_profile(shape, "l40s"),
        ClusterSpec(1, 2),
        SchedulerConfig(**scheduler),
        GROUP,
    )


def on_functions(model, plan, n_functions: int) -> tuple[dict, int]:
    """Samples and prompt tokens computed when the learner's engine prefills the plan's levels and
    `n_functions` decode functions, each given every n-th prompt, start from the bundle."""
    prompts = step_prompts()
    tree = prefix_tree(plan, prompts)
    learner = engine(model)
    bundle = pickle.loads(
        pickle.dumps(KVBundle.pack(learner.prefill(tree.tokens, tree.parents), tree.parents))
    )
    computed, results = learner.stats.prompt_tokens_computed, {}
    for f in range(n_functions):
        function = DecodeFunction(None, 128, 0, EOS, 0, 64, torch.get_num_threads(), "cpu")
        function.engine = engine(model)
        work = [
            (p.uid, p.prompt_ids, list(range(GROUP)), tree.node_of.get(p.uid))
            for p in prompts[f::n_functions]
        ]
        function.assign(work, bundle, PARAMS, 1, [])
        while function.engine.progress().running or function.engine.progress().queued:
            report = function.advance(1.0)
            results.update({(r.uid, r.sample): r.response_ids for r in report.results})
            computed += report.stats.prompt_tokens_computed
    return results, computed


@pytest.mark.parametrize("rule", ["tree", "paper"])
def test_decode_functions_starting_from_the_bundle_sample_what_no_dedup_samples(model, rule):
    plan = make_plan(prefix_rule=rule)
    reference, _ = rollout(
        engine(model), [(p.uid, p.prompt_ids) for p in step_prompts()], GROUP, PARAMS, 1, None
    )
    expected = {(r.uid, r.sample): r.response_ids for r in reference}
    for n_functions in (1, 3):
        results, computed = on_functions(model, plan, n_functions)
        assert results == expected
        assert computed == plan.prefill["tokens_computed"]


def test_the_tree_computes_each_shared_level_once_and_the_paper_rule_each_prompt_whole(model):
    tree, paper = make_plan(), make_plan(prefix_rule="paper")
    ends = sorted((n["start"], n["end"]) for n in tree.prefix_tree)
    assert ends == [(0, 12), (12, 14), (12, 16)]  # the system prompt, then each task's instruction
    unique = len({tuple(p[:k]) for p in PROMPTS for k in range(1, len(p) + 1)})
    assert tree.prefill["tokens_unique"] == paper.prefill["tokens_unique"] == unique
    # one token again: the prompt that is its task's whole instruction computes its last token
    assert (
        tree.prefill["tokens_computed"] == unique + 1 and tree.prefill["tree_ratio"] == (unique + 1) / unique
    )
    assert paper.prefill["tokens_computed"] == sum(map(len, PROMPTS))  # capacity 256: whole prompts
    _, computed = on_functions(model, tree, 2)
    assert prefill_metrics(tree, computed) == {
        "prefill/tokens_unique": float(unique),
        "prefill/tree_ratio": (unique + 1) / unique,
    }
    assert prefix_tree(make_plan(dedup_prefill=False), step_prompts()) is None
