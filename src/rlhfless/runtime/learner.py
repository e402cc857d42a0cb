"""The learner: the policy update from scored samples, its optimizer and its schedule.

Micro-batches come from `micro_batch`, their log-probs from `logprobs`; with one epoch and one
mini-batch the old log-probs are the current ones, detached, so no extra forward pass is spent on
them.

With one update a phase, a prompt group's gradient can also be computed ahead (`learn_ahead`),
before the step's other groups exist: the update's gradient is a sum over micro-batches, each
weighed by its share of the whole batch. Ahead of it, a micro-batch is weighed by its own tokens
(or rows) alone, and `learn` divides what was summed by the batch's total once it is known, then
adds the other groups as usual: the same sum, within float rounding.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlhfless.algo import aggregate_loss, kl_penalty, policy_loss
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import OptimConfig
from rlhfless.runtime.data_parallel import DataParallel
from rlhfless.runtime.logprobs import response_logprobs
from rlhfless.runtime.micro_batch import MicroBatch, pack, stack, tokens_run
from rlhfless.runtime.precision import autocast, deterministic
from rlhfless.runtime.samples import Sample


def shuffle_seed(run_seed: int, updates: int, stream: str) -> int:
    """The seed of the mini-batch shuffle after `updates` optimizer steps: a new one every step,
    the same on a resumed run (the count is checkpointed); `stream` keeps the policy's and the
    critic's orders apart."""
    digest = hashlib.blake2b(f"{run_seed}/{updates}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def update_order(n: int, epochs: int, mini_batches: int, seed: int) -> list[list[int]]:
    """The rows of each optimizer step: `epochs` passes, each split into `mini_batches` shuffled
    chunks (in order when there is one chunk). Seeded, so a resumed run repeats it."""
    generator = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(epochs):
        if mini_batches == 1:
            chunks.append(list(range(n)))
            continue
        order = torch.randperm(n, generator=generator).tolist()
        chunks.extend(order[k::mini_batches] for k in range(mini_batches))
    return chunks


def _scatter(per_mb: list[tuple[list[int], Tensor, Tensor]], n: int) -> list[Tensor]:
    out: list[Tensor] = [torch.empty(0)] * n
    for rows, values, mask in per_mb:
        for b, i in enumerate(rows):
            out[i] = values[b, : int(mask[b].sum())].cpu()
    return out


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; elsewhere nothing).
    Freed activations stay in the process otherwise: after a learning phase that is more than a
    gigabyte the learner holds, unused, until the next one."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def adamw(params: list[torch.nn.Parameter], lr: float, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW, fused: one kernel a parameter and no temporaries as large as the model, where the
    list-wide (foreach) steps allocate one: on a CPU, a 135M model's step takes a fifth of the
    time and half a gigabyte less at its peak."""
    return torch.optim.AdamW(
        params, lr=lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay, fused=True
    )


def prime(optimizer: torch.optim.AdamW) -> None:
    """Allocate `optimizer`'s state now, exactly as its first step would (zero moments, step 0),
    so that the first update does not pay for it: memory never touched before is slow to touch
    on some machines (on this VM AdamW's first step over the default model, which makes 1.08 GB of
    moments, took 9.6 s in one thread, the next 0.06 s). One step at learning rate 0 with zero
    gradients makes the state with torch's own code and moves no parameter; its step counts are
    then set back to 0. An optimizer that has state already (a resumed run's) is left as it is."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(optimizer.state.get(p) for p in params):
        return
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = lr
    for p in params:
        p.grad = None
        optimizer.state[p]["step"].zero_()


SUMS = ("loss/policy", "kl/mean", "actor/clip_frac", "actor/approx_kl")  # an update's weighted metric sums


@dataclass
class Ahead:
    """Gradients learned ahead of a step's update: of which samples, and their metrics' raw sums."""

    keys: set[tuple[str, int]] = field(default_factory=set)
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUMS, 0.0))

    def add(self, keys: set[tuple[str, int]], sums: dict[str, float]) -> None:
        self.keys |= keys
        for key, value in sums.items():
            self.sums[key] += value


class Learner:
    """Owns the policy's optimizer and schedule; updates the policy from scored samples. As one rank
    of a data-parallel learner (`dp`) it computes its share of each step and the ranks add up."""

    def __init__(
        self,
        model: torch.nn.Module,
        algo: AlgorithmConfig,
        optim: OptimConfig,
        total_steps: int,
        micro_batch_tokens: int,
        temperature: float,
        pad_id: int,
        seed: int,
        norm_len: int,
        compute_dtype: str = "float32",
    ) -> None:
        """`seed`: the run's, for the mini-batch shuffle; `norm_len`: the constant that
        `seq-mean-token-sum-norm` divides by, the longest response (`generation.max_new_tokens`);
        `compute_dtype`: the forward passes' (`precision.autocast`)."""
        self.model, self.algo, self.optim_cfg = model, algo, optim
        self.compute_dtype = compute_dtype
        self.micro_batch_tokens, self.temperature, self.pad_id = micro_batch_tokens, temperature, pad_id
        self.seed, self.norm_len = seed, norm_len
        self.device = next(model.parameters()).device  # micro-batches go there; results come back on the CPU
        self.dp = DataParallel()
        self.optimizer = adamw([p for p in model.parameters() if p.requires_grad], optim.lr, optim)
        updates = total_steps * algo.epochs * algo.mini_batches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda(updates))
        self.ahead: Ahead | None = None  # gradients learned ahead of this step's update

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
        return pack(samples, rows, self.micro_batch_tokens, self.pad_id, self.device)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: list[Sample]) -> list[Tensor]:
        """Per-sample response log-probs under `model` (the reference, or the policy before update)."""
        was_training = model.training
        model.eval()
        mine = self.dp.rows(samples, list(range(len(samples))))
        with autocast(model, self.compute_dtype):
            results = [
                (mb.rows, response_logprobs(model, mb, self.temperature), mb.mask)
                for mb in self._batches(samples, mine)
            ]
        model.train(was_training)
        return self.dp.merge(_scatter(results, len(samples)), mine)

    def learn(
        self,
        samples: list[Sample],
        advantages: list[Tensor],
        ref_logprobs: list[Tensor] | None,
        old_logprobs: list[Tensor] | None = None,
        ahead: frozenset[tuple[str, int]] = frozenset(),
    ) -> dict[str, float]:
        """Epochs x mini-batches of clipped policy-gradient updates; returns step metrics.

        `old_logprobs` are the policy's log-probs before this update when the caller already has
        them (PPO with the KL in the reward); otherwise they are computed here only when more than
        one update is made, and one update reuses its own forward pass, detached. `ahead`: the
        samples (keys) whose gradients some rank learned ahead (`learn_ahead`), left out of the
        ranks' shares; this rank's ahead gradients count only if all of theirs are in it.
        """
        algo = self.algo
        old = old_logprobs
        if ahead and (algo.epochs > 1 or algo.mini_batches > 1):
            raise ValueError(
                "learn: gradients learned ahead need one update a step (epochs = mini_batches = 1)"
            )
        if self.ahead is not None and not self.ahead.keys <= ahead:
            self.drop_ahead()
        if old is None and (algo.epochs > 1 or algo.mini_batches > 1):
            old = self.logprobs(self.model, samples)
        self.model.train()
        totals: dict[str, float] = {}
        seed = shuffle_seed(self.seed, self.scheduler.last_epoch, "policy")
        chunks = update_order(len(samples), algo.epochs, algo.mini_batches, seed)
        for n, rows in enumerate(chunks):
            stats = self._update(
                samples, rows, advantages, old, ref_logprobs, last=n == len(chunks) - 1, ahead=ahead
            )
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
        self.optimizer.zero_grad(set_to_none=True)  # not needed until the next step: 4 bytes a parameter
        release_free_memory()
        return {key: value / len(chunks) for key, value in totals.items()}

    def learn_ahead(
        self, samples: list[Sample], advantages: list[Tensor], ref_logprobs: list[Tensor] | None
    ) -> int:
        """Whole prompt groups' gradients, ahead of the step's update: summed into the parameters'
        gradients, each micro-batch weighed by its own tokens (rows, under a per-sequence loss),
        which `learn` divides by the batch's once it is known. Returns the tokens run (each prompt once
        a group, as the micro-batches run it)."""
        if self.ahead is None:
            self.optimizer.zero_grad(set_to_none=True)
            self.ahead = Ahead()
        self.model.train()
        with deterministic(self.device):
            sums = self._backward(
                samples, list(range(len(samples))), advantages, None, ref_logprobs, 1.0, 1.0
            )
        self.ahead.add({s.key for s in samples}, sums)
        return tokens_run(samples)

    def drop_ahead(self) -> None:
        """Forget the gradients learned ahead (the step's update will not count them)."""
        self.ahead = None
        self.optimizer.zero_grad(set_to_none=True)

    def _update(
        self,
        samples: list[Sample],
        rows: list[int],
        advantages: list[Tensor],
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
        last: bool,
        ahead: frozenset[tuple[str, int]] = frozenset(),
    ) -> dict[str, float]:
        tokens = max(sum(len(samples[i].response_ids) for i in rows), 1)
        per = float(tokens) if self.algo.loss_agg == "token-mean" else float(len(rows))
        sums = dict.fromkeys(SUMS, 0.0)
        if self.ahead is not None:  # its raw sums and gradients, now weighed by the whole batch
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(per)
            sums = {
                key: value / (per if key == "loss/policy" else tokens)
                for key, value in self.ahead.sums.items()
            }
            self.ahead = None
        else:
            self.optimizer.zero_grad(set_to_none=True)
        share = [i for i in rows if samples[i].key not in ahead]
        mine = self.dp.rows(samples, share)  # weighed by the whole `rows`
        with deterministic(self.device):
            learned = self._backward(samples, mine, advantages, old, ref, per, tokens)
        for key, value in learned.items():
            sums[key] += value
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        sums = self.dp.reduce_sums(sums)
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        grad_norm = self.dp.step(self.optimizer, trainable, max_norm, share=not last)
        self.scheduler.step()
        return {**sums, "grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0]}

    def _backward(
        self,
        samples: list[Sample],
        rows: list[int],
        advantages: list[Tensor],
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
        per: float,
        tokens: float,
    ) -> dict[str, float]:
        """The loss of `rows`' micro-batches, backward into the gradients: each micro-batch's loss
        weighed by its tokens (rows, under a per-sequence loss) over `per`, its metrics by its
        tokens over `tokens`; returns the metrics' weighted sums."""
        algo = self.algo
        by_tokens = algo.loss_agg == "token-mean"
        sums = dict.fromkeys(SUMS, 0.0)
        for mb in self._batches(samples, rows):
            width = mb.mask.shape[1]
            with autocast(self.model, self.compute_dtype):
                logp = response_logprobs(self.model, mb, self.temperature)
            old_logp = logp.detach() if old is None else stack(old, mb.rows, width, self.device)
            adv = stack(advantages, mb.rows, width, self.device)
            loss, metrics = policy_loss(
                logp,
                old_logp,
                adv,
                mb.mask,
                algo.clip_low,
                algo.clip_high,
                algo.dual_clip,
                algo.loss_agg,
                self.norm_len,
            )
            mb_tokens = float(mb.mask.sum())
            weight = (mb_tokens if by_tokens else len(mb.rows)) / per
            kl_value = 0.0
            if ref is not None:
                kl = kl_penalty(logp, stack(ref, mb.rows, width, self.device), algo.kl_estimator)
                loss = loss + algo.kl_coef * aggregate_loss(kl, mb.mask, algo.loss_agg, self.norm_len)
                kl_value = float((kl.detach() * mb.mask).sum()) / max(mb_tokens, 1.0)
            (loss * weight).backward()
            token_share = mb_tokens / tokens
            sums["loss/policy"] += float(loss.detach()) * weight
            sums["kl/mean"] += kl_value * token_share
            sums["actor/clip_frac"] += float(metrics["clip_frac"]) * token_share
            sums["actor/approx_kl"] += float(metrics["approx_kl"]) * token_share
        return sums

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
