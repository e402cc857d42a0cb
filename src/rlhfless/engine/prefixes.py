"""The step's shared prompt prefixes as the engine computes them: levels of a prefix tree.

Node i is a whole prefix, `tokens[i]`; its parent `parents[i]` (an earlier node, or -1) is a
shorter prefix of it, whose KV its forward starts from, so every level's own tokens are computed
once. `node_of[uid]` names the node a prompt starts from; a prompt not in it has no shared prefix.
The planner decides the tree (`planner.prefix_tree`); the runtime turns the plan into this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhfless.engine.forward import chunks, prefill_forward
from rlhfless.engine.kv import PrefixKV


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
                raise ValueError(
                    f"tokens[{i}]: expected its parent's tokens (parents[{i}] = {parent}) and at least one more"
                )
        for uid, node in self.node_of.items():
            if not 0 <= node < len(self.tokens):
                raise ValueError(f"node_of[{uid!r}]: got {node}, expected a node index")

    def computed_tokens(self) -> int:
        """Tokens the levels compute: each node's own, once."""
        return sum(
            len(t) - (len(self.tokens[p]) if p >= 0 else 0)
            for t, p in zip(self.tokens, self.parents, strict=True)
        )


def prefill_levels(
    model: torch.nn.Module, tree: PrefixTree, pad_token_id: int, kind: str, chunk_tokens: int, version: int
) -> tuple[list[PrefixKV], int]:
    """Each node's KV under weights `version`, level by level: a node's forward starts from its
    parent's KV and computes only its own tokens. With the tokens computed."""
    out: list[PrefixKV | None] = [None] * len(tree.tokens)
    levels: dict[int, list[int]] = {}
    depth: list[int] = []
    for i, p in enumerate(tree.parents):
        depth.append(depth[p] + 1 if p >= 0 else 0)
        levels.setdefault(depth[-1], []).append(i)
    computed = 0
    for level in levels.values():
        rows = [(i, tree.tokens[i], out[tree.parents[i]] if tree.parents[i] >= 0 else None) for i in level]
        # chunked by whole length: each row's forward also holds its parent's KV
        for chunk in chunks(rows, lambda row: len(row[1]), chunk_tokens):
            _, cache, span = prefill_forward(model, [row[1:] for row in chunk], pad_token_id, kind)
            for r, (i, tokens, above) in enumerate(chunk):
                new = len(tokens) - (len(above) if above is not None else 0)
                keys = [k[r, :, span - new :] for k in cache.new_keys]
                values = [v[r, :, span - new :] for v in cache.new_values]
                if above is not None:
                    keys = [torch.cat(kv, dim=1) for kv in zip(above.keys, keys, strict=True)]
                    values = [torch.cat(kv, dim=1) for kv in zip(above.values, values, strict=True)]
                else:
                    keys, values = [k.clone() for k in keys], [v.clone() for v in values]
                out[i] = PrefixKV(tokens, keys, values, version)
                computed += new
    return out, computed  # type: ignore[return-value]
