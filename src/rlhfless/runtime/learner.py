"""The learner: log-probs of responses and the policy update, without padding waste.

Micro-batches are length-bucketed under a token budget, the LM head runs only on response
tokens, a chunk at a time, and with one epoch and one mini-batch the old log-probs are the current
ones, detached, so no extra forward pass is spent on them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlhfless.algo import aggregate_loss, kl_penalty, policy_loss
from rlhfless.config import AlgorithmConfig, OptimConfig
from rlhfless.engine.forward import attention_mask_kind, model_mask
from rlhfless.runtime.data_parallel import DataParallel
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

    The prompt pass yields the KV every sample of the group attends to, and the last prompt
    position's hidden state, which predicts each sample's first response token. The response pass
    runs row k = the group's responses end to end, each token seeing the prompt and the earlier
    tokens of its own sample only: no sample is padded to the group's longest, which on GRPO's
    uneven groups used to be over half the backbone's work.
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

    def packed_attention(self) -> Tensor:
        """[K, 1, Q, P + Q] boolean: a packed token sees its group's real prompt tokens and its own
        sample's tokens up to itself; a padding token sees only itself (never an empty row)."""
        width_q = self.packed_ids.shape[1]
        sample = self.packed_sample
        prompt = self.prompt_mask.bool()[:, None, :].expand(-1, width_q, -1)
        q = torch.arange(width_q, device=sample.device)
        causal = q[None, :, None] >= q[None, None, :]
        own = (sample[:, :, None] == sample[:, None, :]) & (sample[:, :, None] >= 0) & causal
        pad = (sample < 0)[:, :, None] & (q[:, None] == q[None, :])
        own = own | pad
        return torch.cat((prompt & (sample >= 0)[:, :, None], own), dim=-1)[:, None]


def real_hidden(backbone: torch.nn.Module, mb: MicroBatch) -> Tensor:
    """Final hidden states [T, H] at the positions that predict each real response token, in
    `mb.mask` order: the last prompt position, then every response token but the last. Each
    prompt runs once; its KV is shared by the group's samples (with gradients). The policy's LM
    head and the critic's value head both read these states."""
    positions = (mb.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = backbone(
        input_ids=mb.prompt_ids, attention_mask=mb.prompt_mask, position_ids=positions, use_cache=True
    )
    source = [out.last_hidden_state[:, -1]]
    if mb.packed_ids.shape[1]:
        param = next(backbone.parameters())
        follow = backbone(
            input_ids=mb.packed_ids,
            attention_mask=model_mask(mb.packed_attention(), attention_mask_kind(backbone), param.dtype),
            position_ids=mb.packed_positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        source.append(follow.last_hidden_state.flatten(0, 1))
    return torch.cat(source)[mb.sources]


def response_hidden(backbone: torch.nn.Module, mb: MicroBatch) -> Tensor:
    """`real_hidden` laid out as [N, R, H], zero off the mask."""
    hidden = real_hidden(backbone, mb)
    out = hidden.new_zeros((*mb.mask.shape, hidden.shape[-1]))
    return out.masked_scatter(mb.mask.bool()[..., None], hidden)


# Response tokens whose full-vocabulary logits exist at once: 512 x 49152 fp32 is 100 MB, where
# a whole micro-batch's (4096 tokens) would be 800 MB, several times over with its gradient.
LOGIT_CHUNK = 512


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """`head(hidden) / temperature` in fp32, divided in place (a fresh tensor; `/ 1` is skipped,
    which leaves every bit as it was)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if temperature > 0 and temperature != 1:
        logits.div_(temperature)
    return logits


def _token_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, temperature: float):
    """`log softmax(head(hidden) / temperature)[target]` per row of `hidden` [M, H], in fp32; and the
    rows' logsumexp."""
    logits = _logits(hidden, weight, bias, temperature)
    lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


class SelectedLogSoftmax(torch.autograd.Function):
    """`_token_logprobs` under autograd, keeping for the backward pass only the chunk's hidden
    states and logsumexp: the backward recomputes the chunk's logits and turns them into their
    gradient in place, so one chunk's vocabulary-wide tensor is alive at a time, where
    autograd (even with checkpointing) keeps several (the logits, their scaled copy, the
    softmax, the scattered gradient)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature):
        out, lse = _token_logprobs(hidden, weight, bias, targets, temperature)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        # d out / d logits = onehot(target) - softmax, then / temperature through the scaling
        g = _logits(hidden, weight, bias, ctx.temperature).sub_(lse.unsqueeze(-1)).exp_()
        g.mul_(-grad.unsqueeze(-1)).scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))
        if ctx.temperature > 0 and ctx.temperature != 1:
            g.div_(ctx.temperature)
        g = g.to(hidden.dtype)
        grad_hidden = g @ weight if ctx.needs_input_grad[0] else None
        grad_weight = g.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = g.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None


def response_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> Tensor:
    """Log-probs [N, R] of the response tokens, 0 off the mask; each prompt runs once. The LM head
    runs on real response tokens only, `LOGIT_CHUNK` at a time, and under autograd each chunk's
    logits are recomputed in the backward pass instead of kept (`SelectedLogSoftmax`): the
    vocabulary-wide logits of only one chunk are ever alive."""
    head, real = model.get_output_embeddings(), mb.mask.bool()
    hidden, targets = real_hidden(model.base_model, mb), mb.targets[real]
    chunks = []
    for start in range(0, targets.numel(), LOGIT_CHUNK):
        h, t = hidden[start : start + LOGIT_CHUNK], targets[start : start + LOGIT_CHUNK]
        if torch.is_grad_enabled():
            chunks.append(SelectedLogSoftmax.apply(h, head.weight, head.bias, t, temperature))
        else:
            chunks.append(_token_logprobs(h, head.weight, head.bias, t, temperature)[0])
    out = torch.zeros(mb.mask.shape, dtype=torch.float32, device=mb.mask.device)
    return out.masked_scatter(real, torch.cat(chunks)) if chunks else out


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


def stack(
    per_sample: list[Tensor], rows: list[int], width: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Rows `rows` of per-sample token tensors, right-padded with 0 to `width`, on `device`."""
    out = torch.zeros((len(rows), width), device=device)
    for b, i in enumerate(rows):
        out[b, : per_sample[i].numel()] = per_sample[i]
    return out


def release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; elsewhere nothing).
    Freed activations stay in the process otherwise: after a learning phase that is more than a
    gigabyte the learner holds, unused, until the next one."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


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
    ) -> None:
        """`seed`: the run's, for the mini-batch shuffle; `norm_len`: the constant that
        `seq-mean-token-sum-norm` divides by, the longest response (`generation.max_new_tokens`)."""
        self.model, self.algo, self.optim_cfg = model, algo, optim
        self.micro_batch_tokens, self.temperature, self.pad_id = micro_batch_tokens, temperature, pad_id
        self.seed, self.norm_len = seed, norm_len
        self.device = next(model.parameters()).device  # micro-batches go there; results come back on the CPU
        self.dp = DataParallel()
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
        return pack(samples, rows, self.micro_batch_tokens, self.pad_id, self.device)

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: list[Sample]) -> list[Tensor]:
        """Per-sample response log-probs under `model` (the reference, or the policy before update)."""
        was_training = model.training
        model.eval()
        mine = self.dp.rows(samples, list(range(len(samples))))
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
    ) -> dict[str, float]:
        """Epochs x mini-batches of clipped policy-gradient updates; returns step metrics.

        `old_logprobs` are the policy's log-probs before this update when the caller already has
        them (PPO with the KL in the reward); otherwise they are computed here only when more than
        one update is made, and one update reuses its own forward pass, detached.
        """
        algo = self.algo
        old = old_logprobs
        if old is None and (algo.epochs > 1 or algo.mini_batches > 1):
            old = self.logprobs(self.model, samples)
        self.model.train()
        totals: dict[str, float] = {}
        seed = shuffle_seed(self.seed, self.scheduler.last_epoch, "policy")
        chunks = update_order(len(samples), algo.epochs, algo.mini_batches, seed)
        for n, rows in enumerate(chunks):
            stats = self._update(samples, rows, advantages, old, ref_logprobs, last=n == len(chunks) - 1)
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
        self.optimizer.zero_grad(set_to_none=True)  # not needed until the next step: 4 bytes a parameter
        release_free_memory()
        return {key: value / len(chunks) for key, value in totals.items()}

    def _update(
        self,
        samples: list[Sample],
        rows: list[int],
        advantages: list[Tensor],
        old: list[Tensor] | None,
        ref: list[Tensor] | None,
        last: bool,
    ) -> dict[str, float]:
        algo = self.algo
        tokens = sum(len(samples[i].response_ids) for i in rows)
        by_tokens = algo.loss_agg == "token-mean"
        sums = {"loss/policy": 0.0, "kl/mean": 0.0, "actor/clip_frac": 0.0, "actor/approx_kl": 0.0}
        self.optimizer.zero_grad(set_to_none=True)
        for mb in self._batches(samples, self.dp.rows(samples, rows)):  # weighed by the whole `rows`
            width = mb.mask.shape[1]
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
            weight = mb_tokens / max(tokens, 1) if by_tokens else len(mb.rows) / len(rows)
            kl_value = 0.0
            if ref is not None:
                kl = kl_penalty(logp, stack(ref, mb.rows, width, self.device), algo.kl_estimator)
                loss = loss + algo.kl_coef * aggregate_loss(kl, mb.mask, algo.loss_agg, self.norm_len)
                kl_value = float((kl.detach() * mb.mask).sum()) / max(mb_tokens, 1.0)
            (loss * weight).backward()
            token_share = mb_tokens / max(tokens, 1)
            sums["loss/policy"] += float(loss.detach()) * weight
            sums["kl/mean"] += kl_value * token_share
            sums["actor/clip_frac"] += float(metrics["clip_frac"]) * token_share
            sums["actor/approx_kl"] += float(metrics["approx_kl"]) * token_share
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        sums = self.dp.reduce_sums(sums)
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        grad_norm = self.dp.step(self.optimizer, trainable, max_norm, share=not last)
        self.scheduler.step()
        return {**sums, "grad_norm": grad_norm, "actor/lr": self.scheduler.get_last_lr()[0]}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
