"""The one optimizer builder of the project's own loops (PPO, DPO, R2AG's rounds, the preference model).

TRL's trainers (GRPO, SFT) build their own; every loop of this package builds its AdamW here, so
the optimiser and its defaults (PyTorch's: betas (0.9, 0.999), eps 1e-8, weight decay 0.01) are
the same everywhere::

    optimizer = adamw(("policy", model.parameters(), 1e-5), ("critic", critic.parameters(), 1e-4))
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

ParamGroup = tuple[str, Iterable[torch.nn.Parameter], float]


def adamw(*groups: ParamGroup) -> torch.optim.AdamW:
    """AdamW over named parameter groups ``(name, parameters, learning rate)``, each at its own rate."""
    return torch.optim.AdamW(
        [{"params": list(params), "lr": lr, "name": name} for name, params, lr in groups]
    )
