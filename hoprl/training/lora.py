"""LoRA RL: TRL trains low-rank adapters (peft) instead of every weight.

``hyperparameters.lora_rank`` turns it on for the GRPO family through TRL: the trainer gets a
``peft.LoraConfig`` (:func:`lora_config`) on every linear layer of the policy (peft's
``"all-linear"``, the output layer excepted), TRL wraps the model, and only the adapters carry
gradients and optimizer state. The transformers rollout engine decodes with the live wrapped model,
so rollouts always sample the adapters of the current step (no copy to sync); TRL's vLLM
integration merges the adapters into the weights it pushes to vLLM after each step.

While a rollout decodes, the adapters are folded into the frozen weights (:func:`adapters_merged`:
peft's ``merge_adapter``, then ``unmerge_adapter``): the same policy, decoded with one matmul per
linear layer instead of three (the weight, then the adapter's A and B). Unmerging subtracts what
merging added, which in float32 leaves the frozen weights off by a rounding, so the weights are
also copied back from a copy taken before the merge: they stay bit for bit the warm start's, step
after step. The loss, which needs the adapters apart for their gradients, always runs unmerged.
``bench/rl_whole_step.py`` measures the rollouts both ways.

LoRA is reported to match full fine-tuning in RL at about ten times the full-tuning learning rate,
even at low rank (Thinking Machines Lab, "LoRA Without Regret", 2025); the learning
rate is the request's, not scaled here.

A checkpoint then holds TRL's adapter files (what a resumed job reloads) and, in ``merged/``, the
policy with the adapters folded in (:func:`save_merged`): a whole model, so the policy service,
evaluations and a later job's warm start load it like any other checkpoint. :func:`servable` is
the folder the registry records.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hoprl.schemas.trainer import Hyperparameters

#: the merged policy's folder inside a LoRA checkpoint
MERGED = "merged"


def lora_config(hp: Hyperparameters) -> Any:
    """peft's config for ``hp.lora_rank`` (alpha = ``hp.lora_alpha`` or twice the rank), else None."""
    if hp.lora_rank is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=hp.lora_rank,
        lora_alpha=int(hp.lora_alpha or 2 * hp.lora_rank),
        lora_dropout=0.0,  # dropout would make the rollout's and the loss's log-probs differ
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def is_lora(model: Any) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


@contextmanager
def adapters_merged(model: Any, merge: bool = True) -> Iterator[None]:
    """A peft model's adapters folded into its weights inside the block (module docstring); any
    other model, or ``merge=False``, as it is."""
    if not (merge and is_lora(model)):
        yield
        return
    import torch

    with torch.no_grad():
        frozen = [(p, p.detach().clone()) for n, p in model.named_parameters() if "base_layer" in n]
        model.merge_adapter()
    try:
        yield
    finally:
        with torch.no_grad():
            model.unmerge_adapter()  # peft's own bookkeeping: the layers know they are apart again
            for weight, before in frozen:
                weight.copy_(before)  # and the weights exactly what they were (module docstring)


def save_merged(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Write ``model`` (a peft model) with its adapters folded into the weights to ``folder/merged``;
    the training model is left as it is (a copy is merged)."""
    target = folder / MERGED
    merged = copy.deepcopy(model).merge_and_unload()
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def servable(folder: Path) -> Path:
    """The folder a checkpoint is served and warm-started from: ``merged/`` for LoRA, else itself."""
    return folder / MERGED if (folder / MERGED / "config.json").is_file() else folder
