"""RLHFless: cost-efficient, strictly synchronous RLHF with serverless rollout workers."""

__version__ = "0.1.0"
