"""Log-probs (and the hidden states under them) of a micro-batch's response tokens: each prompt
runs once, the LM head only on real response tokens, a chunk at a time, its logits recomputed in
the backward pass instead of kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlhfless.engine.forward import attention_mask_kind, model_mask
from rlhfless.runtime.micro_batch import MicroBatch


def real_hidden(backbone: torch.nn.Module, mb: MicroBatch) -> Tensor:
    """Final hidden states [T, H] at the positions that predict each real response token, in
    `mb.mask` order: the last prompt position, then every response token but the last. Each
    prompt runs once, in the same pass as its group's packed responses, which attend to it (with
    gradients). The policy's LM head and the critic's value head both read these states."""
    param = next(backbone.parameters())
    out = backbone(
        input_ids=mb.input_ids(),
        attention_mask=model_mask(mb.attention(), attention_mask_kind(backbone), param.dtype),
        position_ids=mb.positions(),
        use_cache=False,
    )
    hidden, width_p = out.last_hidden_state, mb.prompt_ids.shape[1]
    return torch.cat((hidden[:, width_p - 1], hidden[:, width_p:].flatten(0, 1)))[mb.sources]


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
        kind = hidden.device.type
        ctx.autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        return out

    @staticmethod
    def backward(ctx, grad):
        # The recomputed logits and the head's gradients in the dtype the forward ran in (autocast
        # is off in a backward pass unless restored): the same logits the forward's log-probs saw.
        if ctx.autocast is None:
            return SelectedLogSoftmax._backward(ctx, grad)
        with torch.autocast(grad.device.type, dtype=ctx.autocast):
            return SelectedLogSoftmax._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        # d out / d logits = onehot(target) - softmax, then / temperature through the scaling
        g = _logits(hidden, weight, bias, ctx.temperature).sub_(lse.unsqueeze(-1)).exp_()
        g.mul_(-grad.unsqueeze(-1)).scatter_add_(-1, targets.unsqueeze(-1), grad.unsqueeze(-1))
        if ctx.temperature > 0 and ctx.temperature != 1:
            g.div_(ctx.temperature)
        g = g.to(hidden.dtype)
        grad_hidden = (g @ weight).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = (g.t() @ hidden).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_bias = g.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
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
