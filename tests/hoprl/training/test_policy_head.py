"""The loss's log-probs computed at the policy's tokens only: the same values and gradients as TRL's
every-position computation where the loss reads them, and the LM head projects only those rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import trl.trainer.utils as trl_utils
from transformers import AutoModelForCausalLM
from trl.kernels import chunked_logprob
from trl.trainer.utils import add_fused_lm_head

from hoprl.training.policy_head import IGNORE, policy_labels, policy_token_logps, score_compactly


@pytest.fixture
def model(tiny_model: str) -> Any:
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    add_fused_lm_head(policy, outputs=("log_probs", "entropy"))
    return policy


def batch() -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Two rows of 4 prompt and 6 completion tokens; row 1 padded by 2 at the end. The policy wrote
    completion tokens 0-1 and 5 of row 0 (2-4 are a passage) and 0-3 of row 1."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (2, 10), generator=generator)
    attention = torch.ones(2, 10, dtype=torch.long)
    attention[1, 8:] = 0
    score = torch.tensor([[1, 1, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]])
    return ids, attention, 6, score


def test_labels_keep_only_the_policys_completion_tokens() -> None:
    ids, attention, keep, score = batch()
    labels = policy_labels(ids, attention, keep, score)
    kept = (labels != IGNORE).int()
    assert kept.tolist() == [[0, 0, 0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]]
    assert torch.equal(labels[kept.bool()], ids[kept.bool()])


def full_logps(model: Any, ids: torch.Tensor, attention: torch.Tensor, keep: int) -> tuple[Any, Any]:
    """TRL's own computation: every completion position labelled (``_get_per_token_logps_and_entropies``)."""
    labels = ids.masked_fill(attention == 0, IGNORE)
    labels[:, :-keep] = IGNORE
    out = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def test_the_policys_log_probs_entropies_and_gradients_are_trls_and_the_rest_is_zero(model: Any) -> None:
    ids, attention, keep, score = batch()
    mine, entropy = policy_token_logps(model, ids, attention, keep, score, batch_size=1, compute_entropy=True)
    mine.masked_select(score.bool()).sum().backward()
    mine_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    theirs, their_entropy = full_logps(model, ids, attention, keep)
    theirs.masked_select(score.bool()).sum().backward()
    their_grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    assert entropy is not None
    on = score.bool()
    torch.testing.assert_close(mine[on], theirs[on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[on], their_entropy[on], atol=1e-5, rtol=1e-5)
    assert mine[~on].abs().max() == 0 and entropy[~on].abs().max() == 0
    assert theirs[~on][:3].abs().min() > 0  # TRL did score the passage tokens
    assert len(mine_grads) == len(their_grads) > 0
    for a, b in zip(mine_grads, their_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_on_cpu_the_lm_head_projects_only_the_labelled_rows(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, attention, keep, score = batch()
    rows: list[int] = []
    original = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden: torch.Tensor, *args: Any) -> Any:
        rows.append(hidden.size(0))
        return original(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    monkeypatch.setattr(trl_utils, "_use_triton", chunked_logprob._use_triton)  # TRL's own; restored after
    policy_token_logps(model, ids, attention, keep, score)
    assert rows == [2 * 9]  # TRL off Triton: every position of both rows (10 tokens, shifted by one)
    assert score_compactly() and score_compactly()  # idempotent
    rows.clear()
    policy_token_logps(model, ids, attention, keep, score)
    assert rows == [int(score.sum())]  # 3 + 4 policy tokens
