"""Grouped-query attention in the kernel under a padding mask: the same logits, no repeated heads."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from hoprl.generation.attention import NAME, kernel_gqa, use_kernel_gqa


def gqa_model(attn: str = "sdpa") -> Any:
    """A random two-layer Llama with 4 query heads over 2 key/value heads (SmolLM2's 9 over 3)."""
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def padded_decode(model: Any) -> torch.Tensor:
    """Three rows, two of them left-padded, prefilled together; then two decode steps (the batch's
    shape: one token a row under a mask); the steps' logits."""
    ids = torch.randint(3, 128, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :4], mask[2, :7] = 0, 0
    cache, steps = DynamicCache(config=model.config), []
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        for token in (5, 9):
            mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
            out = model(input_ids=torch.full((3, 1), token), attention_mask=mask, past_key_values=cache)
            steps.append(out.logits)
    return torch.cat(steps)


def test_masked_steps_attend_without_repeating_heads_and_say_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = gqa_model()
    reference = padded_decode(model)  # transformers' sdpa: repeats the key/value heads under a mask
    repeats: list[int] = []
    original = sdpa.repeat_kv
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: repeats.append(n) or original(h, n))
    with kernel_gqa(model):
        assert model.config._attn_implementation == NAME
        grouped = padded_decode(model)
    assert repeats == []  # every masked step (and the masked prefill) grouped the heads in the kernel
    torch.testing.assert_close(grouped, reference, rtol=1e-5, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # back for the trainer after the block
    padded_decode(model)
    assert repeats and set(repeats) == {2}  # the check above would see transformers' own repeats


def test_other_implementations_are_left_alone() -> None:
    model = gqa_model("eager")
    assert use_kernel_gqa(model) == "eager" and model.config._attn_implementation == "eager"
    with kernel_gqa(model):
        assert model.config._attn_implementation == "eager"
    sdpa_model = gqa_model()
    assert use_kernel_gqa(sdpa_model) == "sdpa" and sdpa_model.config._attn_implementation == NAME
