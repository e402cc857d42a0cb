"""PPO's critic: a value head on a copy of the policy's backbone, with its own optimizer.

It reads the same hidden states as the policy's LM head (`response_hidden`: each prompt once,
packed micro-batches, no padding waste), so a value per response token costs one backbone pass.
With one epoch and one mini-batch the values GAE needs come from the update's own forward pass,
detached: the critic then costs one forward and one backward per step, nothing more.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from rlhfless.algo import explained_variance, gae, masked_mean, value_loss
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import OptimConfig
from rlhfless.runtime.data_parallel import DataParallel
from rlhfless.runtime.learner import adamw, shuffle_seed, update_order
from rlhfless.runtime.logprobs import response_hidden
from rlhfless.runtime.micro_batch import MicroBatch, pack, stack
from rlhfless.runtime.precision import autocast, deterministic
from rlhfless.runtime.samples import Sample


class ValueModel(torch.nn.Module):
    """A causal LM's backbone and a linear head giving one value per position."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        # Zero at first: values start at 0, and the backbone is not pushed around by a random head.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy(cls, policy: torch.nn.Module) -> ValueModel:
        """The critic starts from the policy's weights (its own copy) and a fresh head."""
        backbone = copy.deepcopy(policy.base_model).train().requires_grad_(True)
        param = next(policy.parameters())
        return cls(backbone, policy.config.hidden_size).to(param.device, param.dtype)


def response_values(critic: ValueModel, mb: MicroBatch) -> Tensor:
    """Values [N, R]: `V_t` of the state before response token `t` is sampled; 0 off the mask."""
    hidden = response_hidden(critic.backbone, mb)
    return critic.value_head(hidden).squeeze(-1).float() * mb.mask


def _padded(per_sample: list[Tensor], width: int) -> tuple[Tensor, Tensor]:
    """All samples' token tensors as one [B, width] batch, and its mask."""
    rows = list(range(len(per_sample)))
    return stack(per_sample, rows, width), stack([torch.ones(t.numel()) for t in per_sample], rows, width)


class Critic:
    """Owns the value model and its AdamW; fits it to GAE returns and hands back the advantages.
    As one rank of a data-parallel learner (`dp`) it computes its share, as the policy's `Learner`."""

    def __init__(
        self,
        model: ValueModel,
        algo: AlgorithmConfig,
        optim: OptimConfig,
        micro_batch_tokens: int,
        pad_id: int,
        seed: int,
        norm_len: int,
        compute_dtype: str = "float32",
    ) -> None:
        """`seed`, `norm_len` and `compute_dtype` as for the policy's `Learner`."""
        self.model, self.algo, self.optim_cfg = model, algo, optim
        self.compute_dtype = compute_dtype
        self.micro_batch_tokens, self.pad_id = micro_batch_tokens, pad_id
        self.seed, self.norm_len = seed, norm_len
        self.updates = 0  # optimizer steps so far: the shuffle's counter, checkpointed
        self.device = next(model.parameters()).device  # micro-batches go there; results come back on the CPU
        self.dp = DataParallel()
        self.optimizer = adamw(list(model.parameters()), algo.critic_lr, optim)

    def _batches(self, samples: list[Sample], rows: list[int]) -> list[MicroBatch]:
        return pack(samples, rows, self.micro_batch_tokens, self.pad_id, self.device)

    @torch.no_grad()
    def values(self, samples: list[Sample]) -> list[Tensor]:
        """Per-sample response values under the current critic, no gradients."""
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        self.model.eval()
        mine = self.dp.rows(samples, list(range(len(samples))))
        for mb in self._batches(samples, mine):
            with autocast(self.model, self.compute_dtype):
                values = response_values(self.model, mb)
            for b, i in enumerate(mb.rows):
                out[i] = values[b, : len(samples[i].response_ids)].cpu()
        self.model.train()
        return self.dp.merge(out, mine)

    def update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict[str, float]]:
        """`_update` with deterministic kernels on a GPU (`precision.deterministic`)."""
        with deterministic(self.device):
            return self._update(samples, rewards)

    def _update(self, samples: list[Sample], rewards: list[Tensor]) -> tuple[list[Tensor], dict[str, float]]:
        """GAE from the critic's values before this update, then epochs x mini-batches of clipped
        value-loss steps towards the returns. `rewards` are per-sample token rewards.

        Returns the per-sample advantages (not whitened) and the metrics `loss/value` (mean over
        updates), `value/mean` and `value/explained_variance` (of the returns by the pre-update
        values; 0 when the returns do not vary), `critic/grad_norm`, `critic/vf_clip_frac`.
        """
        algo, n = self.algo, len(samples)
        lengths = [len(s.response_ids) for s in samples]
        fused = algo.epochs == 1 and algo.mini_batches == 1
        old: list[Tensor] = [torch.empty(0)] * n
        advantages: list[Tensor] = [torch.empty(0)] * n
        returns: list[Tensor] = [torch.empty(0)] * n
        if not fused:
            old = self.values(samples)
            values, mask = _padded(old, max(lengths))
            adv, ret = gae(_padded(rewards, max(lengths))[0], values, mask, algo.gamma, algo.lam)
            for i, r in enumerate(lengths):
                advantages[i], returns[i] = adv[i, :r], ret[i, :r]
        seed = shuffle_seed(self.seed, self.updates, "critic")
        chunks = update_order(n, algo.epochs, algo.mini_batches, seed)
        totals = {"loss/value": 0.0, "critic/grad_norm": 0.0, "critic/vf_clip_frac": 0.0}
        self.model.train()
        for n, rows in enumerate(chunks):
            tokens = max(sum(lengths[i] for i in rows), 1)
            self.optimizer.zero_grad(set_to_none=True)
            mine = self.dp.rows(samples, rows)
            for mb in self._batches(samples, mine):  # weighed by the whole `rows`
                width = mb.mask.shape[1]
                with autocast(self.model, self.compute_dtype):
                    values = response_values(self.model, mb)
                if fused:  # the pre-update values are this very forward's, detached
                    old_v = values.detach()
                    rewards_mb = stack(rewards, mb.rows, width, self.device)
                    adv, ret = gae(rewards_mb, old_v, mb.mask, algo.gamma, algo.lam)
                    for b, i in enumerate(mb.rows):
                        advantages[i], returns[i], old[i] = (
                            adv[b, : lengths[i]].cpu(),
                            ret[b, : lengths[i]].cpu(),
                            old_v[b, : lengths[i]].cpu(),
                        )
                else:
                    old_v = stack(old, mb.rows, width, self.device)
                    ret = stack(returns, mb.rows, width, self.device)
                loss = value_loss(values, old_v, ret, mb.mask, algo.value_clip, algo.loss_agg, self.norm_len)
                token_share = float(mb.mask.sum()) / tokens
                weight = token_share if algo.loss_agg == "token-mean" else len(mb.rows) / len(rows)
                (loss * weight).backward()
                totals["loss/value"] += float(loss.detach()) * weight
                if algo.value_clip is not None:
                    moved = ((values.detach() - old_v).abs() > algo.value_clip).float()
                    totals["critic/vf_clip_frac"] += float(masked_mean(moved, mb.mask)) * token_share
            max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
            params = list(self.model.parameters())
            totals["critic/grad_norm"] += self.dp.step(self.optimizer, params, max_norm, n < len(chunks) - 1)
            self.updates += 1
        if fused:  # each rank filled its own rows
            merged = self.dp.merge(list(zip(advantages, returns, old, strict=True)), mine)
            advantages, returns, old = (list(column) for column in zip(*merged, strict=True))
        shares = self.dp.reduce_sums({k: v for k, v in totals.items() if k != "critic/grad_norm"})
        totals |= shares  # the grad norm is rank 0's, whose metrics the step keeps
        metrics = {key: value / len(chunks) for key, value in totals.items()}
        values, mask = _padded(old, max(lengths))
        ret = _padded(returns, max(lengths))[0]
        explained = explained_variance(values, ret, mask)
        metrics["value/mean"] = float(masked_mean(values, mask))
        metrics["value/explained_variance"] = float(explained) if torch.isfinite(explained) else 0.0
        return advantages, metrics

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state.get("updates", 0)  # checkpoints before the counter existed start it at 0
