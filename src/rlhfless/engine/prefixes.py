"""The step's shared prompt prefixes as the engine computes them: levels of a prefix tree.

Node i is a whole prefix, `tokens[i]`; its parent `parents[i]` (an earlier node, or -1) is a
shorter prefix of it, whose KV its forward starts from, so every level's own tokens are computed
once. `node_of[uid]` names the node a prompt starts from; a prompt not in it has no shared prefix.
The planner decides the tree (`planner.prefix_tree`); the runtime turns the plan into this.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixTree:
    tokens: list[list[int]]
    parents: list[int]
    node_of: dict[str, int]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"parents: got {len(self.parents)}, expected one per node ({len(self.tokens)})")
        for i, (tokens, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if not -1 <= parent < i:
                raise ValueError(f"parents[{i}]: got {parent}, expected -1 or an earlier node")
            above = self.tokens[parent] if parent >= 0 else []
            if len(tokens) <= len(above) or tokens[: len(above)] != above:
                raise ValueError(f"tokens[{i}]: expected its parent's tokens and at least one more")
        for uid, node in self.node_of.items():
            if not 0 <= node < len(self.tokens):
                raise ValueError(f"node_of[{uid!r}]: got {node}, expected a node index")

    def computed_tokens(self) -> int:
        """Tokens the levels compute: each node's own, once."""
        return sum(
            len(t) - (len(self.tokens[p]) if p >= 0 else 0)
            for t, p in zip(self.tokens, self.parents, strict=True)
        )
