"""EVO-RAG preference pairs from stored episodes (ranking, siblings, 1:1 balance, margin) and TRL DPO."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hoprl.domain import Episode, Step
from hoprl.recipes.evo_rag import SIGNALS, EvoRagConfig, episode_step_rewards, step_weights
from hoprl.training.dpo import DPOJobConfig, build_pairs, returns_to_go, sibling_groups, train_dpo

INFO = "\n<information>\nDoc 1 (Title: Acme) Acme was founded by Jane Roe.\n</information>\n"


def step(t: int, text: str, **signals: float) -> Step:
    """A hand-scored step: signals set directly (no judge, no embedder)."""
    action = "answer" if text.startswith("<answer>") else "search"
    values = dict.fromkeys(SIGNALS, 0.0) | {"r_step": -1.0} | signals
    return Step(t=t, action=action, text=text, information=INFO if action == "search" else "", signals=values)


def episode(steps: list[Step], qid: str = "q1", sample: int = 0) -> Episode:
    return Episode(
        recipe="evo-rag",
        question_id=qid,
        question=f"Question {qid}?",
        answers=["Jane Roe"],
        sample=sample,
        prompt=[
            {"role": "system", "content": "Search, then answer."},
            {"role": "user", "content": f"Question {qid}?"},
        ],
        steps=steps,
        meta={"evo_rag": {"stage": "discovery", "version": "evo_rag@1"}},
    )


GOOD, MISS = "<search>Acme founder</search>", "<search>Acme weather</search>"
RIGHT, WRONG = "<answer>Jane Roe</answer>", "<answer>John Doe</answer>"


def tree() -> list[Episode]:
    """q1: GOOD->RIGHT (twice), GOOD->WRONG, MISS->WRONG; q2 repeats GOOD->RIGHT alone."""
    return [
        episode([step(1, GOOD, r_ret=1.0), step(2, RIGHT, r_ans=1.0)], sample=0),
        episode([step(1, GOOD, r_ret=1.0), step(2, WRONG, r_ans=0.0)], sample=1),
        episode([step(1, MISS, r_ret=-1.0), step(2, WRONG, r_ans=0.0)], sample=2),
        episode([step(1, GOOD, r_ret=1.0), step(2, RIGHT, r_ans=1.0)], sample=3),
        episode([step(1, GOOD, r_ret=1.0), step(2, RIGHT, r_ans=1.0)], qid="q2"),
    ]


def test_returns_to_go() -> None:
    assert returns_to_go([1.0, 2.0, 3.0]) == [6.0, 5.0, 3.0]
    assert returns_to_go([]) == []


def test_siblings_share_question_and_prefix_and_differ_at_step_t() -> None:
    groups = sibling_groups(tree())
    assert [(g.question_id, g.t, sorted(g.candidates)) for g in groups] == [
        ("q1", 1, sorted([GOOD, MISS])),
        ("q1", 2, sorted([RIGHT, WRONG])),
    ]
    # the step-2 prompt is the conversation up to and including GOOD and its information
    prompt = groups[1].prompt
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[2]["content"] == GOOD and prompt[3]["content"] == INFO
    assert len(groups[1].candidates[RIGHT]) == 2  # the duplicate continuation is one candidate


def test_pairs_rank_by_weighted_return_from_t() -> None:
    rows = build_pairs(tree(), delta=0.0)
    assert [(r["t"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows] == [
        (1, GOOD, MISS),
        (2, RIGHT, WRONG),
    ]
    cfg = EvoRagConfig()
    w1, w2 = step_weights(1, "discovery", cfg), step_weights(2, "discovery", cfg)
    # t=1: G_1(GOOD) is the mean over the three q1 episodes through GOOD; G_1(MISS) one episode
    r2 = {RIGHT: w2["r_ans"] - w2["r_step"], WRONG: -w2["r_step"]}
    g_good = w1["r_ret"] - w1["r_step"] + (2 * r2[RIGHT] + r2[WRONG]) / 3
    g_miss = -w1["r_ret"] - w1["r_step"] + r2[WRONG]
    assert rows[0]["margin"] == pytest.approx(g_good - g_miss)
    assert rows[1]["margin"] == pytest.approx(w2["r_ans"])  # G_2 differs only in r_ans
    assert episode_step_rewards(tree()[0])[1] == pytest.approx(r2[RIGHT])
    assert rows[1]["prompt"][-1]["content"] == INFO
    assert rows[0]["prompt"] == tree()[0].prompt


def four_siblings(qid: str = "q1") -> list[Episode]:
    """Four one-step candidates after the same prompt with G_1 = 2 x - 0.02 for x = 2, 1.5, 1, .5."""
    return [
        episode([step(1, f"<search>q{x}</search>", r_ret=x)], qid=qid, sample=i)
        for i, x in enumerate([1.0, 2.0, 0.5, 1.5])
    ]


def test_pairs_are_balanced_one_to_one() -> None:
    rows = build_pairs(four_siblings(), delta=0.0)
    pairs = [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows]
    assert pairs == [
        ("<search>q2.0</search>", "<search>q0.5</search>"),
        ("<search>q1.5</search>", "<search>q1.0</search>"),
    ]
    chosen, rejected = [c for c, _ in pairs], [r for _, r in pairs]
    assert len(set(chosen)) == len(set(rejected)) == len(rows) and not set(chosen) & set(rejected)
    assert [r["margin"] for r in rows] == pytest.approx([3.0, 1.0])


def test_margin_filter_drops_close_pairs() -> None:
    assert len(build_pairs(four_siblings(), delta=0.99)) == 2
    rows = build_pairs(four_siblings(), delta=1.0)  # margin must exceed delta strictly
    assert [r["margin"] for r in rows] == pytest.approx([3.0])
    assert build_pairs(four_siblings(), delta=3.5) == []
    assert build_pairs([tree()[-1]]) == []  # no siblings, no pairs


def test_two_dpo_steps_change_weights(tiny_model: str, tmp_path: Path) -> None:
    rows = build_pairs(tree() + four_siblings("q3"), delta=0.1)
    assert len(rows) == 3  # the t=2 pair of q1 (margin w_ans(2) ~ 0.05) falls under delta
    config = DPOJobConfig(steps=2, batch_size=2, learning_rate=1e-3)
    history = train_dpo(tiny_model, rows, config, tmp_path)
    losses = [h["loss"] for h in history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "model.embed_tokens.weight" in changed and any("layers.1" in k for k in changed)


def test_sibling_pairs_rank_the_candidates_of_one_step_by_their_prefix_return() -> None:
    """App. A.4: pairs from the sibling candidates sampled at one step, valued by the prefix's
    weighted return sum_{s<=t} R_s. One episode with siblings (tests/hoprl/training/test_siblings.py
    works out each R_t by hand from §3.3 and Table 2):

    t = 1 (p = 0): hit search R_1 = 1.98, missing search -2.02, answer 0.03. Ranked hit > answer >
    miss; the best pairs with the worst: (hit, miss), margin 4.0; the middle one stays unpaired.
    t = 2 (both after the hit, 1.98): answer 1.98 + 0.031053 = 2.011053, refusal 1.98 - 0.521579
    = 1.458421; one pair (answer, refusal), margin 0.552632.

    Independent-prefix pairing finds nothing here: a single episode shares no prefix with another."""
    from hoprl.recipes.evo_rag import EvoRag
    from hoprl.training.dpo import sibling_pairs
    from tests.hoprl.training.test_siblings import episode as sibling_episode

    rows, branches = sibling_pairs([sibling_episode()], EvoRag(), delta=0.1)
    assert [(r["t"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows] == [
        (1, "<search>Acme founder</search>", "<search>Zeta river</search>"),
        (2, "<answer>Jane Roe</answer>", "<refuse/>"),
    ]
    assert [r["margin"] for r in rows] == pytest.approx([4.0, 0.552632], abs=1e-5)
    assert rows[0]["prompt"] == [{"role": "user", "content": "Who founded Acme?"}]
    # step 2's prompt: the question, step 1's search and its information
    assert [m["role"] for m in rows[1]["prompt"]] == ["user", "assistant", "user"]
    assert rows[1]["prompt"][1]["content"] == "<search>Acme founder</search>"
    assert len(branches) == 3 + 2  # every scored branch, for the preference model
    assert build_pairs([sibling_episode()]) == []
    # a margin filter above the step-2 margin keeps only the step-1 pair
    assert [r["t"] for r in sibling_pairs([sibling_episode()], EvoRag(), delta=1.0)[0]] == [1]


def test_a_dpo_job_rolls_out_siblings_unless_asked_for_prefix_pairs(tiny_model: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from hoprl.domain import Question
    from hoprl.jobspec import resolve
    from hoprl.recipes.evo_rag import EvoRag
    from hoprl.registry.store import Registry
    from hoprl.schemas.trainer import JobRequest
    from hoprl.training.offpolicy import OffPolicyTrainer
    from hoprl.training.rollout import RolloutOptions
    from tests.conftest import shape

    cpu = {"preset": "cpu"}
    request = JobRequest(recipe="evo-rag", objective="dpo", model=tiny_model, hyperparameters=cpu)
    q = Question(id="q", dataset="t", split="train", question="Who founded Acme?", answers=["Jane Roe"])
    opts = RolloutOptions(
        collection="c", retriever_url="http://127.0.0.1:9", num_generations=2, shape=shape()
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    with Registry(f"sqlite:///{tmp_path / 'r.db'}") as registry:
        for pairs, expected in ((None, True), ("prefixes", False)):
            hp = resolve(request.hyperparameters, "evo-rag", "dpo").model_copy(
                update={"preference_model": False, "dpo_pairs": pairs or "siblings"}
            )
            trainer = OffPolicyTrainer("dpo", request, hp, EvoRag(), model, tokenizer, [q], [q], opts,
                                       registry, "job-x", str(tmp_path))  # fmt: skip
            assert trainer.sibling_rollouts is expected
    assert resolve(request.hyperparameters, "evo-rag", "dpo").dpo_pairs == "siblings"
