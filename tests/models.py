"""Tiny models for tests: a random Llama with the real SmolLM2 tokenizer and chat template.

The tiny model (2 layers, width 64) keeps a GRPO step near a second on two CPU cores while using
the real tokenizer and chat template, so masks and episodes are the production ones.
"""

from __future__ import annotations

from pathlib import Path

import torch


def make_tiny_model(tokenizer_path: str, target: Path, seed: int = 0) -> str:
    """A seeded random 2-layer Llama sharing SmolLM2's tokenizer, saved as a checkpoint folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)
