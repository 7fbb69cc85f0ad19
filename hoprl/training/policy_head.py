"""Log-probs of the policy's own tokens only: the LM head skips prompts, padding and retrieved text.

An agent episode's completion is mostly text the policy did not write: the passages a search
returned (``tool_mask`` 0). TRL's loss masks them out, but first computes them: its fused LM head
(:func:`trl.trainer.utils.add_fused_lm_head`) projects every position through the vocabulary, and
off Triton devices it scores every position of the sequence, prompt included, so that Neuron
compiles one tile shape (TRL's comment in that function). In ``make run``'s RL step (8
when-to-search episodes, 8,555 tokens, 1,409 of them the policy's) the head's forward and backward
took 19% of the step (``bench/rl_step.py`` under cProfile, 2026-11-29); scoring only the 16% of
positions the loss reads removes most of that.

Two pieces, both TRL's own code paths with different inputs:

- :func:`score_compactly`: the fused head's compact path (the positions whose label is not -100,
  gathered before the projection) on CPU too. Eager CPU kernels have no tile shapes to recompile;
  the values at scored positions are the same, the others 0 either way. TRL chooses the path with
  ``trl.trainer.utils._use_triton``, which that module uses for nothing else, so the switch
  replaces that one name there (no other module's copy); with a TRL that no longer has it, it does
  nothing, and only the speed is lost.
- :func:`policy_token_logps`: TRL's per-token log-probs loop (text models) with the labels of
  non-policy tokens set to -100, so the compact head never sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

log = logging.getLogger("hoprl.trainer")

IGNORE = -100


def score_compactly() -> bool:
    """Make TRL's fused LM head score only labelled positions on every device; True when in place."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        log.debug("trl.trainer.utils has no _use_triton: the fused LM head keeps its own choice")
        return False
    if getattr(original, "hoprl_compact", False):
        return True

    def compact(device: torch.device) -> bool:
        return device.type == "cpu" or bool(original(device))

    compact.hoprl_compact = True  # type: ignore[attr-defined]
    trl_utils._use_triton = compact
    return True


def loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """The positions TRL's loss reads: ``completion_mask``, times ``tool_mask`` where the batch has
    one (0 on retrieved text)."""
    mask: torch.Tensor = batch["completion_mask"]
    return mask * batch["tool_mask"] if "tool_mask" in batch else mask


def policy_labels(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, score_mask: torch.Tensor
) -> torch.Tensor:
    """The fused head's labels: the ids where ``score_mask`` (over the last ``logits_to_keep``
    positions) is 1, -100 on the prompt, on padding and where it is 0."""
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE)
    labels[:, :-logits_to_keep] = IGNORE
    tail = labels[:, -logits_to_keep:]
    labels[:, -logits_to_keep:] = tail.masked_fill(score_mask.to(tail.device) == 0, IGNORE)
    return labels


def policy_token_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    score_mask: torch.Tensor,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    autocast: Callable[[], AbstractContextManager[Any]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the completion's last ``logits_to_keep`` positions,
    as TRL's ``_get_per_token_logps_and_entropies`` returns them, computed only where
    ``score_mask`` is 1 (0 elsewhere). ``model`` carries TRL's fused LM head."""
    size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), size):
        rows = slice(start, start + size)
        ids, attention = input_ids[rows], attention_mask[rows]
        labels = policy_labels(ids, attention, logits_to_keep, score_mask[rows])
        with autocast() if autocast is not None else nullcontext():
            out = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
        logps.append(out.log_probs[:, -logits_to_keep:])
        if compute_entropy:
            entropies.append(out.entropy[:, -logits_to_keep:])
    return torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None
