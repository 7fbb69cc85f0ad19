"""Grouped-query attention in the kernel, also under a padding mask: the engines' decode steps.

transformers' ``sdpa`` attention lets PyTorch's kernel handle grouped-query attention (fewer key and
value heads than query heads) only when no attention mask is passed (``use_gqa_in_sdpa``, a CUDA
restriction); with a mask it first repeats every key and value head to the number of query heads,
copying the layer's whole cache. The continuous batch's decode steps always pass a mask (its rows are
left-padded to one length), so on SmolLM2-135M (9 query heads, 3 key/value heads) each decode step
copied every layer's cache three times over. PyTorch's CPU kernel takes ``enable_gqa`` with a mask:
a decode step of 8 rows over 1,000 cached positions took 0.120 s against 0.205 s, with identical
logits (``python bench/decode_step.py``, 2026-11-29, 2-core AMD EPYC, one thread).

:data:`NAME` is transformers' sdpa attention with that one difference, registered with transformers'
attention and mask interfaces; :func:`kernel_gqa` switches a model to it for a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "hoprl_sdpa_gqa"


def sdpa_gqa_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' sdpa attention; with a mask and fewer key/value heads than query heads, the
    kernel groups the heads itself (``enable_gqa``) instead of being given repeated copies. Without
    a mask (or with a position bias) it is transformers' function unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or groups <= 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # with a mask, transformers' function is not causal and slices nothing: only its repeat differs
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_kernel_gqa(model: Any) -> str:
    """Switch ``model`` to :data:`NAME` where it attends with ``sdpa`` (another implementation is
    left alone); returns the implementation it had."""
    before: str = model.config._attn_implementation
    if before == "sdpa":
        model.set_attn_implementation(NAME)
    return before


@contextmanager
def kernel_gqa(model: Any) -> Iterator[None]:
    """:func:`use_kernel_gqa` inside the block, the model's own implementation after it."""
    before = use_kernel_gqa(model)
    try:
        yield
    finally:
        if model.config._attn_implementation != before:
            model.set_attn_implementation(before)
