"""Generation: deduplicated prefill, continuous batching, exactly resumable sampling."""

from rlhfless.engine.base import GenerationEngine
from rlhfless.engine.engine import Engine
from rlhfless.engine.kv import PrefixKV, StaleCacheError
from rlhfless.engine.prefixes import PrefixTree
from rlhfless.engine.rollout import RolloutStats, rollout
from rlhfless.engine.sampling import SamplingParams
from rlhfless.engine.sequences import EngineStats, Progress, Request, SequenceResult, SequenceState

__all__ = [
    "Engine",
    "EngineStats",
    "GenerationEngine",
    "PrefixKV",
    "PrefixTree",
    "Progress",
    "Request",
    "RolloutStats",
    "SamplingParams",
    "SequenceResult",
    "SequenceState",
    "StaleCacheError",
    "rollout",
]
