"""EVO-RAG's GRPO over sibling candidates (§3.4, App. A.5): groups, step rewards and advantages
computed by hand from the paper's printed equations.

Step reward (§3.3): ``R_t = sum_k w_k(t) r_k(t)``, ``w_k(t) = (1 - p) w_Start + p w_Mid`` in
Discovery, ``p(t) = (t - 1) / (T_max - 1)`` with T_max = 20 (App. A.2, A.3; Table 2 weights).
Advantage (§3.4): ``A_t^(i) = (r~_t^(i) - mu_t) / (sigma_t + eps)`` over the siblings, with the
sample std (verl's ``torch.std``, unbiased) and eps = 1e-6 (verl).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from transformers import AutoTokenizer

from hoprl.domain import Episode, RetrievedDoc, Step
from hoprl.recipes.evo_rag import EvoRag
from hoprl.training.siblings import (
    SIBLINGS,
    branch,
    candidate_trajectory,
    sibling_advantages,
    sibling_groups,
    sibling_rows,
)

GOLD = RetrievedDoc(id="acme", title="Acme", text="Acme was founded by Jane Roe.")
OTHER = RetrievedDoc(id="zeta", title="Zeta", text="Zeta is a river.")


def search(t: int, query: str, doc: RetrievedDoc) -> Step:
    return Step(t=t, action="search", text=f"<search>{query}</search>", queries=[query], docs=[[doc]],
                information=f"<information>{doc.text}</information>")  # fmt: skip


def answer(t: int, text: str) -> Step:
    return Step(t=t, action="answer", text=f"<answer>{text}</answer>", answer=text)


def episode() -> Episode:
    """The episode searched Acme (gold) at step 1 and answered at step 2; at step 1 two siblings
    were sampled (a search that misses, an immediate correct answer), at step 2 one (a refusal)."""
    return Episode(
        recipe="evo-rag", question_id="q", question="Who founded Acme?", answers=["Jane Roe"],
        gold_titles=["Acme"], prompt=[{"role": "user", "content": "Who founded Acme?"}],
        steps=[search(1, "Acme founder", GOLD), answer(2, "Jane Roe")],
        meta={SIBLINGS: {
            "1": [search(1, "Zeta river", OTHER).model_dump(), answer(1, "Jane Roe").model_dump()],
            "2": [Step(t=2, action="refuse", text="<refuse/>").model_dump()],
        }},
    )  # fmt: skip


def test_step_1_siblings_rewards_and_advantages_by_hand() -> None:
    """t = 1: p = 0, Discovery Start weights (w_ret 2.0, w_step 0.02, w_ans 0.05).
    hit:    w_ret * 1 + w_step * (-1)        = 2.0 - 0.02  =  1.98   (first query: r_dup 0; p < 0.3: r_act 0)
    miss:   w_ret * (-1) + w_step * (-1)     = -2.0 - 0.02 = -2.02
    answer: w_ans * (EM 1 + F1 1) / 2 - 0.02 = 0.05 - 0.02 =  0.03
    mean = (1.98 - 2.02 + 0.03) / 3 = -0.01 / 3; deviations 1.98333, -2.01667, 0.03333;
    sample variance = (3.933611 + 4.066944 + 0.001111) / 2 = 4.000833, std = 2.000208;
    A = (0.991563, -1.008229, 0.016665)."""
    groups = sibling_groups(episode(), EvoRag())
    branches, rewards = groups[0]
    assert [b.steps[-1].action for b in branches] == ["search", "search", "answer"]
    assert all(len(b.steps) == 1 for b in branches)  # nothing before step 1
    assert rewards == pytest.approx([1.98, -2.02, 0.03])
    advantages = sibling_advantages(rewards)
    assert advantages == pytest.approx([0.991563, -1.008229, 0.016665], abs=2e-6)
    # the population std (divide by 3) would give 1.633163 and A = (1.214412, ...): not the convention
    assert advantages[0] != pytest.approx(1.983333 / math.sqrt(8.001667 / 3), abs=1e-3)


def test_step_2_siblings_share_the_prefix_and_two_siblings_give_plus_minus_one_over_root_2() -> None:
    """t = 2: p = 1/19; w_ans = 0.05 + 0.05/19 = 0.052632, w_step = 0.02 + 0.03/19 = 0.021579,
    w_ref = 0.5. Both branches hold step 1's search of Acme, so the refusal's evidence contains
    "Jane Roe": answerable, r_ref = -1 (rules judge).
    answer: 0.052632 - 0.021579 =  0.031053;  refuse: -0.5 - 0.021579 = -0.521579.
    Two siblings: mean -0.245263, sample std = 0.552632 / sqrt(2) = 0.390766, A = +-1/sqrt(2)."""
    (_, _), (branches, rewards) = sibling_groups(episode(), EvoRag())
    assert [[s.action for s in b.steps] for b in branches] == [["search", "answer"], ["search", "refuse"]]
    assert all(b.steps[0].queries == ["Acme founder"] for b in branches)
    assert rewards == pytest.approx([0.031053, -0.521579], abs=1e-6)
    assert sibling_advantages(rewards) == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-5)


def test_flat_siblings_have_no_signal() -> None:
    assert sibling_advantages([0.5, 0.5, 0.5]) is None


def test_a_branch_drops_siblings_and_scores() -> None:
    scored = EvoRag().score(episode())
    b = branch(scored, 2, Step(t=2, action="refuse", text="<refuse/>"))
    assert SIBLINGS not in b.meta and "evo_rag" not in b.meta and all(not s.signals for s in b.steps)
    assert SIBLINGS in scored.meta  # the episode itself is untouched


def test_rows_train_only_the_candidates_tokens(tiny_model: str) -> None:
    """A row is the branch's tokens with mask 1 on the candidate's text alone; one row per sibling
    of every group with spread (3 at step 1, 2 at step 2)."""
    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model)
    rows, advantages, counts, branches = sibling_rows([episode()], EvoRag(), tokenizer)
    assert len(branches) == 5
    assert counts == {"siblings/groups": 2.0, "siblings/flat": 0.0, "siblings/rows": 5.0}
    assert len(rows) == len(advantages) == 5
    assert advantages[:3] == pytest.approx([0.991563, -1.008229, 0.016665], abs=2e-6)
    b = branch(episode(), 2, answer(2, "Jane Roe"))
    row = candidate_trajectory(b, tokenizer)
    trained = [i for i, m in zip(row.completion_ids, row.mask, strict=True) if m]
    assert tokenizer.decode(trained) == "<answer>Jane Roe</answer>"
