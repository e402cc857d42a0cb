"""Locality-aware placement: where each decode actor runs and how late it can start.

The learner, the prefill actor and the decode actor with the heaviest workload share the first
GPUs of node 0: that actor needs no weight sync and no KV transfer, it only waits for prefill.
Other actors take GPU slots by workload, heavier ones nearer (rest of node 0, then node 1, ...).
A remote actor starts decoding at max(L_model, L_prefill + L_kv): weights are sent as soon as the
learner finishes, prefix KV only after prefill. Weights and KV are sharded over an actor's tensor-
parallel GPUs, each GPU receiving its shard over its own link, so an actor of G GPUs receives at
G times the per-GPU bandwidth (`transfer_seconds`, also what the simulator charges). Transfer is hidden for actor i when
start_i + L_decode_i <= L_prefill + L_decode_1; when it is not, the delay simply shows in T_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlhfless.planner.ordering import lex_order


@dataclass
class ClusterSpec:
    """GPUs the planner may place actors on, and what moving weights and KV costs."""

    nodes: int = 1
    gpus_per_node: int = 8
    intra_node_bandwidth: float = 300e9  # bytes/s, GPU to GPU within a node
    inter_node_bandwidth: float = 36e9  # bytes/s, across nodes
    model_bytes: int = 0  # policy weights sent to every remote decode actor each step
    kv_bytes_per_token: int = 0  # KV cache bytes of one token (all layers)
    # GPUs of each node when they differ (node 0 first, e.g. what a Ray cluster has free); when
    # given, `nodes` and `gpus_per_node` (the largest node) follow from it. Empty: uniform nodes.
    node_gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.node_gpus:
            if min(self.node_gpus) < 1:
                raise ValueError(f"node_gpus: got {self.node_gpus}, expected integers >= 1")
            self.node_gpus = tuple(self.node_gpus)
            self.nodes, self.gpus_per_node = len(self.node_gpus), max(self.node_gpus)
        for name in ("nodes", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected an integer >= 1")
        for name in ("intra_node_bandwidth", "inter_node_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected bytes/s > 0")
        for name in ("model_bytes", "kv_bytes_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected bytes >= 0")

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus) if self.node_gpus else self.nodes * self.gpus_per_node

    def slots_per_node(self, gpus_per_actor: int) -> int:
        """Actor slots of the largest node (every node, when they are uniform)."""
        return self.gpus_per_node // gpus_per_actor

    def node_slots(self, gpus_per_actor: int) -> list[int]:
        """Actor slots of each node, node 0 first."""
        gpus = self.node_gpus or (self.gpus_per_node,) * self.nodes
        return [g // gpus_per_actor for g in gpus]

    def max_actors(self, gpus_per_actor: int) -> int:
        return sum(self.node_slots(gpus_per_actor))

    def transfer_seconds(self, nbytes: Any, same_node: Any, gpus_per_actor: int) -> np.ndarray:
        """Seconds to move `nbytes` (weights or KV) to an actor of `gpus_per_actor` GPUs, each GPU
        receiving its tensor-parallel shard over its own link."""
        bandwidth = np.where(same_node, self.intra_node_bandwidth, self.inter_node_bandwidth)
        return np.asarray(nbytes, dtype=float) / (bandwidth * gpus_per_actor)

    def slot_gpus(self, slots: Any, gpus_per_actor: int) -> tuple[np.ndarray, np.ndarray]:
        """(node, first global GPU id) of each placement slot (0 = the learner's GPUs), slots
        filling node 0 first; an actor's GPUs are `gpus_per_actor` from its first. Slots past
        the cluster's stay on the last node."""
        gpus = np.array(self.node_gpus or (self.gpus_per_node,) * self.nodes)
        slots_of = gpus // gpus_per_actor
        past = np.cumsum(slots_of)  # each node's slots end before this one
        node = np.minimum(np.searchsorted(past, slots, side="right"), gpus.size - 1)
        local = slots - (past - slots_of)[node]
        return node, (np.cumsum(gpus) - gpus)[node] + local * gpus_per_actor


def rank_within(groups: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Rank of each item inside its group by descending weight (ties: earlier item first)."""
    order = lex_order((-weight, groups))
    group_sorted = groups[order]
    first = np.flatnonzero(np.r_[True, group_sorted[1:] != group_sorted[:-1]])
    counts = np.diff(np.r_[first, group_sorted.size])
    ranks = np.empty(weight.size, dtype=np.int64)
    ranks[order] = np.arange(weight.size) - np.repeat(first, counts)
    return ranks


def start_delays(
    slots: np.ndarray,
    kv_tokens: np.ndarray,
    prefill_s: float,
    cluster: ClusterSpec,
    gpus_per_actor: int,
    weights_held: bool = False,
) -> np.ndarray:
    """Seconds from the end of learning until each actor can decode, by its placement slot: the
    prefix KV, and the new weights unless its GPUs hold them already (`weights_held`: the learner
    handed them over)."""
    same_node = slots < cluster.node_slots(gpus_per_actor)[0]
    weights = (
        0.0 if weights_held else cluster.transfer_seconds(cluster.model_bytes, same_node, gpus_per_actor)
    )
    kv = prefill_s + cluster.transfer_seconds(
        cluster.kv_bytes_per_token * kv_tokens, same_node, gpus_per_actor
    )
    return np.where(slots == 0, prefill_s, np.maximum(weights, kv))
