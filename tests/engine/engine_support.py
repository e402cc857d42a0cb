"""The small random Llama the engine's tests generate with (grouped-query attention, 2 layers)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def small_llama(vocab_size: int, max_positions: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()
