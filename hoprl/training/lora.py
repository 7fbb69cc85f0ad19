"""LoRA RL: TRL trains low-rank adapters (peft) instead of every weight.

``hyperparameters.lora_rank`` turns it on for the GRPO family through TRL: the trainer gets a
``peft.LoraConfig`` (:func:`lora_config`) on every linear layer of the policy (peft's
``"all-linear"``, the output layer excepted), TRL wraps the model, and only the adapters carry
gradients and optimizer state. The transformers rollout engine decodes with the live wrapped model,
so rollouts always sample the adapters of the current step (no copy to sync); TRL's vLLM
integration merges the adapters into the weights it pushes to vLLM after each step.

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
