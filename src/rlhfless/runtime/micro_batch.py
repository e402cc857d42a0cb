"""The learner's micro-batches: samples grouped by prompt, groups packed under a token budget,
each prompt's responses end to end in one row, so that no sample is padded to its group's longest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhfless.runtime.samples import Sample


@dataclass
class Group:
    """Samples that share one prompt: the learner runs that prompt once for all of them."""

    rows: list[int]
    prompt_len: int
    response_lens: list[int]

    def cost(self) -> tuple[int, int]:
        """Tokens the backbone runs: the prompt, and the group's responses packed in one row."""
        return self.prompt_len, sum(self.response_lens)


def prompt_groups(samples: list[Sample], rows: list[int]) -> list[Group]:
    by_uid: dict[str, list[int]] = {}
    for i in rows:
        by_uid.setdefault(samples[i].uid, []).append(i)
    return [
        Group(idx, len(samples[idx[0]].prompt_ids), [len(samples[i].response_ids) for i in idx])
        for idx in by_uid.values()
    ]


def tokens_run(samples: list[Sample]) -> int:
    """Tokens the learner's backbone runs for these samples: each prompt once a group, and every
    response (`Group.cost`)."""
    return sum(sum(group.cost()) for group in prompt_groups(samples, list(range(len(samples)))))


def micro_batches(groups: list[Group], token_budget: int) -> list[list[int]]:
    """Group indices packed so that padded prompt tokens plus padded packed-response tokens fit the
    budget: K groups cost K x (longest prompt + longest packed row).

    Longest first, so groups of one micro-batch are alike and padding wastes little.
    A single group over the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(groups)), key=lambda g: -sum(groups[g].cost()))
    batches: list[list[int]] = []
    shape = (0, 0, 0)  # groups, longest prompt, longest packed row of the open batch
    for g in order:
        p, r = groups[g].cost()
        k, pmax, rmax = shape
        grown = (k + 1, max(pmax, p), max(rmax, r))
        if batches and grown[0] * (grown[1] + grown[2]) <= token_budget:
            batches[-1].append(g)
            shape = grown
        else:
            batches.append([g])
            shape = (1, p, r)
    return batches


@dataclass
class MicroBatch:
    """K prompts left-padded; each prompt's samples' responses packed into one row after it.

    One forward pass runs row k = the group's prompt, then its responses end to end, each response
    token seeing the prompt and the earlier tokens of its own sample only: no sample is padded to
    the group's longest, which on GRPO's uneven groups used to be over half the backbone's work.
    The last prompt position's hidden state predicts each sample's first response token. One pass
    with no KV cache is what lets activation checkpointing recompute a layer.
    """

    rows: list[int]  # sample indices, in micro-batch order
    prompt_ids: Tensor  # [K, P] left-padded
    prompt_mask: Tensor  # [K, P]
    packed_ids: Tensor  # [K, Q]: each group's response tokens but their last, end to end
    packed_positions: Tensor  # [K, Q]: their position ids (prompt length + offset in the sample)
    packed_sample: Tensor  # [K, Q]: which sample of `rows` each packed token belongs to; -1: padding
    sources: Tensor  # [T]: per real response token, its hidden state's row in `response_hidden`'s source
    targets: Tensor  # [N, R]
    mask: Tensor  # [N, R], 1 on real response tokens

    @classmethod
    def build(cls, samples: list[Sample], groups: list[Group], pad_id: int) -> MicroBatch:
        rows = [i for g in groups for i in g.rows]
        n_groups = len(groups)
        width_p = max(g.prompt_len for g in groups)
        width_r = max(max(g.response_lens) for g in groups)
        width_q = max(sum(max(n - 1, 0) for n in g.response_lens) for g in groups)
        prompt_ids = torch.full((n_groups, width_p), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((n_groups, width_p), dtype=torch.long)
        packed_ids = torch.full((n_groups, width_q), pad_id, dtype=torch.long)
        packed_positions = torch.zeros((n_groups, width_q), dtype=torch.long)
        packed_sample = torch.full((n_groups, width_q), -1, dtype=torch.long)
        targets = torch.full((len(rows), width_r), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width_r))
        sources: list[int] = []  # 0..K-1: a prompt's last position; K + k * Q + q: packed token q of row k
        b = 0
        for k, g in enumerate(groups):
            prompt_ids[k, width_p - g.prompt_len :] = torch.tensor(samples[g.rows[0]].prompt_ids)
            prompt_mask[k, width_p - g.prompt_len :] = 1
            q = 0
            for i in g.rows:
                response = samples[i].response_ids
                r, fed = len(response), max(len(response) - 1, 0)  # the last token is only a target
                targets[b, :r] = torch.tensor(response, dtype=torch.long)
                mask[b, :r] = 1.0
                packed_ids[k, q : q + fed] = torch.tensor(response[:fed], dtype=torch.long)
                packed_positions[k, q : q + fed] = torch.arange(g.prompt_len, g.prompt_len + fed)
                packed_sample[k, q : q + fed] = b
                first = n_groups + k * width_q + q
                sources.extend(([k] if r else []) + list(range(first, first + fed)))
                q += fed
                b += 1
        return cls(
            rows,
            prompt_ids,
            prompt_mask,
            packed_ids,
            packed_positions,
            packed_sample,
            torch.tensor(sources, dtype=torch.long),
            targets,
            mask,
        )

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with its tensors on `device` (the model's)."""
        tensors = (
            self.prompt_ids,
            self.prompt_mask,
            self.packed_ids,
            self.packed_positions,
            self.packed_sample,
            self.sources,
            self.targets,
            self.mask,
        )
        return MicroBatch(self.rows, *(t.to(device) for t in tensors))

    def input_ids(self) -> Tensor:
        """[K, P + Q]: each group's prompt, then its packed responses."""
        return torch.cat((self.prompt_ids, self.packed_ids), dim=1)

    def positions(self) -> Tensor:
        """[K, P + Q] position ids: the prompt's from 0 (left padding at 0), then the packed ones."""
        return torch.cat(((self.prompt_mask.cumsum(-1) - 1).clamp(min=0), self.packed_positions), dim=1)

    def attention(self) -> Tensor:
        """[K, 1, P + Q, P + Q] boolean: a prompt token sees its prompt's real tokens up to itself;
        a packed token sees its group's real prompt tokens and its own sample's tokens up to
        itself; a padding token sees only itself (never an empty row)."""
        width_p, width_q = self.prompt_ids.shape[1], self.packed_ids.shape[1]
        real = self.prompt_mask.bool()
        p = torch.arange(width_p, device=real.device)
        prompt = real[:, None, :] & (p[None, :, None] >= p[None, None, :]) & real[:, :, None]
        prompt = prompt | (~real[:, :, None] & (p[:, None] == p[None, :]))
        prompt = torch.cat((prompt, prompt.new_zeros((*prompt.shape[:2], width_q))), dim=-1)
        sample = self.packed_sample
        q = torch.arange(width_q, device=sample.device)
        causal = q[None, :, None] >= q[None, None, :]
        own = (sample[:, :, None] == sample[:, None, :]) & (sample[:, :, None] >= 0) & causal
        own = own | ((sample < 0)[:, :, None] & (q[:, None] == q[None, :]))
        sees_prompt = real[:, None, :].expand(-1, width_q, -1) & (sample >= 0)[:, :, None]
        return torch.cat((prompt, torch.cat((sees_prompt, own), dim=-1)), dim=1)[:, None]


def pack(
    samples: list[Sample], rows: list[int], token_budget: int, pad_id: int, device: torch.device | str = "cpu"
) -> list[MicroBatch]:
    """The micro-batches of `rows` on `device`: samples grouped by prompt, groups packed under the
    budget."""
    groups = prompt_groups(samples, rows)
    return [
        MicroBatch.build(samples, [groups[g] for g in chosen], pad_id).to(device)
        for chosen in micro_batches(groups, token_budget)
    ]


def stack(
    per_sample: list[Tensor], rows: list[int], width: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Rows `rows` of per-sample token tensors, right-padded with 0 to `width`, on `device`."""
    out = torch.zeros((len(rows), width), device=device)
    for b, i in enumerate(rows):
        out[b, : per_sample[i].numel()] = per_sample[i]
    return out
