"""The small random Llamas the engine's tests generate with."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def _llama(seed: int, **shape) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**shape)).eval()


def small_llama(vocab_size: int, max_positions: int) -> LlamaForCausalLM:
    """Grouped-query attention, 2 layers."""
    return _llama(
        0,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )


def one_layer_llama(vocab_size: int, seed: int) -> LlamaForCausalLM:
    """A one-layer Llama whose weights `seed` draws: a second model's weights to load."""
    return _llama(
        seed,
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
