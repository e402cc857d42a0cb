"""Reductions of a `[batch, seq]` per-token loss to a scalar; they decide how much each token and
each sequence weighs in the gradient (long responses dominate under `token-mean`, not under the
`seq-mean-*` modes)."""

from torch import Tensor

from rlhfless.algo.masked import masked_mean
from rlhfless.algo.registry import get_loss_aggregation, register_aggregation

__all__ = ["aggregate_loss"]


@register_aggregation("token-mean")
def _token_mean(loss: Tensor, mask: Tensor, norm_len: float) -> Tensor:
    """`sum_{b,t} m L / sum_{b,t} m`: every response token of the batch weighs the same."""
    return masked_mean(loss, mask)


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(loss: Tensor, mask: Tensor, norm_len: float) -> Tensor:
    """`mean_b (sum_t m L / sum_t m)` over the sequences that have at least one response token."""
    tokens = mask.sum(dim=-1)
    per_seq = (loss * mask).sum(dim=-1) / tokens.clamp(min=1e-8)
    has_tokens = (tokens > 0).to(per_seq.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(loss: Tensor, mask: Tensor, norm_len: float) -> Tensor:
    """`mean_b sum_t m L`: each sequence's summed loss, averaged over all `batch` rows."""
    return (loss * mask).sum(dim=-1).mean()


@register_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, norm_len: float) -> Tensor:
    """`mean_b sum_t m L / norm_len`: Dr. GRPO's length-unbiased constant normaliser. It must not
    depend on how the batch was cut or padded, so callers pass a fixed length (the maximum response
    length, as VERL's `loss_scale_factor` advises). VERL sums over sequences instead of averaging:
    its value is `batch` times this one."""
    return (loss * mask).sum(dim=-1).mean() / norm_len


def aggregate_loss(loss: Tensor, mask: Tensor, mode: str, norm_len: float | None = None) -> Tensor:
    """Scalar loss from per-token `loss` and `mask` (`[batch, seq]`); `mode` names an entry of
    `LOSS_AGGREGATIONS`:

    - `token-mean`: `sum_{b,t} m L / sum_{b,t} m`
    - `seq-mean-token-mean`: `mean_b (sum_t m L / sum_t m)`, over rows with a response token
    - `seq-mean-token-sum`: `mean_b sum_t m L`
    - `seq-mean-token-sum-norm`: `mean_b sum_t m L / norm_len`; `norm_len=None` takes the mask's
      width, which is constant only if every batch is padded to the same length
    """
    if loss.shape != mask.shape or loss.dim() != 2:
        shapes = f"loss {tuple(loss.shape)}, mask {tuple(mask.shape)}"
        raise ValueError(f"loss: got shapes {shapes}, expected equal [batch, seq] shapes")
    norm = mask.shape[-1] if norm_len is None else norm_len
    return get_loss_aggregation(mode)(loss, mask.to(loss.dtype), norm)
