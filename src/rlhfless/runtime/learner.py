"""The learner: log-probs of responses and the policy update, without padding waste.

Micro-batches are length-bucketed under a token budget, the LM head runs only on response
positions, and with one epoch and one mini-batch the old log-probs are the current ones,
detached, so no extra forward pass is spent on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhfless.algo import aggregate_loss, kl_penalty, policy_loss
from rlhfless.config import AlgorithmConfig, OptimConfig
from rlhfless.runtime.samples import Sample


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices grouped so that (rows x longest row) stays within the budget; longest first.

    Sorting by length keeps rows of one micro-batch alike, so right-padding wastes little.
    A single row longer than the budget gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@dataclass
class MicroBatch:
    """Right-padded inputs, and response-aligned targets and positions."""

    rows: list[int]
    input_ids: Tensor  # [b, L]
    attention_mask: Tensor  # [b, L]
    positions: Tensor  # [b, R]: the position whose logits predict each response token
    targets: Tensor  # [b, R]
    mask: Tensor  # [b, R], 1 on real response tokens

    @classmethod
    def build(cls, samples: list[Sample], rows: list[int], pad_id: int) -> MicroBatch:
        seqs = [samples[i].prompt_ids + samples[i].response_ids for i in rows]
        width = max(map(len, seqs))
        resp = max(len(samples[i].response_ids) for i in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        positions = torch.zeros((len(rows), resp), dtype=torch.long)
        targets = torch.full((len(rows), resp), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), resp))
        for b, (i, seq) in enumerate(zip(rows, seqs, strict=True)):
            p, r = len(samples[i].prompt_ids), len(samples[i].response_ids)
            input_ids[b, : len(seq)] = torch.tensor(seq)
            attention_mask[b, : len(seq)] = 1
            positions[b, :r] = torch.arange(p - 1, p + r - 1)
            targets[b, :r] = torch.tensor(samples[i].response_ids)
            mask[b, :r] = 1.0
        return cls(rows, input_ids, attention_mask, positions, targets, mask)


def response_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> Tensor:
    """Log-probs [b, R] of the response tokens; the LM head sees response positions only."""
    hidden = model.base_model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state
    picked = hidden.gather(1, mb.positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    logits = model.get_output_embeddings()(picked).float()
    if temperature > 0:
        logits = logits / temperature
    chosen = logits.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    return (chosen - torch.logsumexp(logits, dim=-1)) * mb.mask


def _scatter(per_mb: list[tuple[list[int], Tensor, Tensor]], n: int) -> list[Tensor]:
    out: list[Tensor] = [torch.empty(0)] * n
    for rows, values, mask in per_mb:
        for b, i in enumerate(rows):
            out[i] = values[b, : int(mask[b].sum())]
    return out


def _stack(per_sample: list[Tensor], rows: list[int], width: int) -> Tensor:
    out = torch.zeros((len(rows), width))
    for b, i in enumerate(rows):
        out[b, : per_sample[i].numel()] = per_sample[i]
    return out


class Learner:
    """Owns the policy's optimizer and schedule; updates the policy from scored samples."""

    def __init__(
        self,
        model: torch.nn.Module,
        algo: AlgorithmConfig,
        optim: OptimConfig,
        total_steps: int,
        micro_batch_tokens: int,
        temperature: float,
        pad_id: int,
    ) -> None:
        self.model, self.algo, self.optim_cfg = model, algo, optim
        self.micro_batch_tokens, self.temperature, self.pad_id = micro_batch_tokens, temperature, pad_id
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        updates = total_steps * algo.epochs * algo.mini_batches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda(updates))

    def _lr_lambda(self, updates: int):
        warmup, cosine = self.optim_cfg.warmup_steps, self.optim_cfg.schedule == "cosine"

        def factor(i: int) -> float:
            if i < warmup:
                return (i + 1) / warmup
            if not cosine:
                return 1.0
            progress = (i - warmup) / max(1, updates - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

        return factor

    def _batches(self, samples: list[Sample], rows: list[int] | None = None) -> list[MicroBatch]:
        rows = list(range(len(samples))) if rows is None else rows
        lengths = [len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in rows]
        return [
            MicroBatch.build(samples, [rows[j] for j in group], self.pad_id)
            for group in micro_batches(lengths, self.micro_batch_tokens)
        ]

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: list[Sample]) -> list[Tensor]:
        """Per-sample response log-probs under `model` (the reference, or the policy before update)."""
        was_training = model.training
        model.eval()
        results = [
            (mb.rows, response_logprobs(model, mb, self.temperature), mb.mask)
            for mb in self._batches(samples)
        ]
        model.train(was_training)
        return _scatter(results, len(samples))

    def learn(
        self, samples: list[Sample], advantages: list[Tensor], ref_logprobs: list[Tensor] | None
    ) -> dict[str, float]:
        """Epochs x mini-batches of clipped policy-gradient updates; returns step metrics."""
        algo = self.algo
        reuse_old = algo.epochs == 1 and algo.mini_batches == 1
        old = None if reuse_old else self.logprobs(self.model, samples)
        self.model.train()
        totals: dict[str, float] = {}
        count = 0
        generator = torch.Generator().manual_seed(len(samples))
        for _ in range(algo.epochs):
            order = (
                torch.randperm(len(samples), generator=generator).tolist() if algo.mini_batches > 1 else None
            )
            for chunk in range(algo.mini_batches):
                rows = list(range(len(samples))) if order is None else order[chunk :: algo.mini_batches]
                stats = self._update(samples, rows, advantages, old, ref_logprobs)
                for key, value in stats.items():
                    totals[key] = totals.get(key, 0.0) + value
                count += 1
        return {key: value / count for key, value in totals.items()}

    def _update(
        self,
        samples: list[Sample],
        rows: list[int],
        advantages: list[Tensor],
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
    ) -> dict[str, float]:
        algo = self.algo
        tokens = sum(len(samples[i].response_ids) for i in rows)
        by_tokens = algo.loss_agg == "token-mean"
        sums = {"loss/policy": 0.0, "kl/mean": 0.0, "actor/clip_frac": 0.0, "actor/approx_kl": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self._batches(samples, rows):
            width = mb.mask.shape[1]
            logp = response_logprobs(self.model, mb, self.temperature)
            old_logp = logp.detach() if old is None else _stack(old, mb.rows, width)
            adv = _stack(advantages, mb.rows, width)
            loss, metrics = policy_loss(
                logp, old_logp, adv, mb.mask, algo.clip_low, algo.clip_high, algo.dual_clip, algo.loss_agg
            )
            mb_tokens = float(mb.mask.sum())
            weight = mb_tokens / max(tokens, 1) if by_tokens else len(mb.rows) / len(rows)
            kl_value = 0.0
            if ref is not None:
                kl = kl_penalty(logp, _stack(ref, mb.rows, width), algo.kl_estimator)
                loss = loss + algo.kl_coef * aggregate_loss(kl, mb.mask, algo.loss_agg)
                kl_value = float((kl.detach() * mb.mask).sum()) / max(mb_tokens, 1.0)
            (loss * weight).backward()
            token_share = mb_tokens / max(tokens, 1)
            sums["loss/policy"] += float(loss.detach()) * weight
            sums["kl/mean"] += kl_value * token_share
            sums["actor/clip_frac"] += float(metrics["clip_frac"]) * token_share
            sums["actor/approx_kl"] += float(metrics["approx_kl"]) * token_share
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.optimizer.step()
        self.scheduler.step()
        return {**sums, "grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0]}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
