"""``POST /v1/rollouts``: token-level trajectories whose masks and ids agree with the episodes."""

from __future__ import annotations

import httpx
from transformers import AutoTokenizer

from hoprl.clients.policy import PolicyClient
from hoprl.domain import Paragraph, Question
from tests.conftest import shape

from .conftest import COLLECTION

QUESTIONS = [
    Question(
        id="q1", dataset="tiny", split="dev", question="Who founded Acme Records?", answers=["Jane Roe"],
        paragraphs=[Paragraph(title="Acme Records", text="Founded by Jane Roe.", is_gold=True)],
        gold_titles=["Acme Records"],
    ),
    Question(id="q2", dataset="tiny", split="dev", question="Where is Velmora?", answers=["Ostland"]),
]  # fmt: skip


def test_rollouts_masks_ids_and_logprobs(policy_url: str, model_path: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sampling = {"shape": shape(max_steps=2, max_new_tokens_per_step=16, token_budget=1024, temperature=1.0)}
    with PolicyClient(policy_url) as policy:
        reply = policy.rollouts(QUESTIONS, "search-r1", COLLECTION, n_samples=2, sampling=sampling)
    assert [(r.episode.question_id, r.episode.sample) for r in reply.rollouts] == [
        ("q1", 0), ("q1", 1), ("q2", 0), ("q2", 1),
    ]  # fmt: skip
    with_logprobs = 0
    for rollout in reply.rollouts:
        ep, traj = rollout.episode, rollout.trajectory
        assert len(traj.mask) == len(traj.completion_ids) and traj.prompt_ids
        generated = [t for t, m in zip(traj.completion_ids, traj.mask, strict=True) if m]
        assert tokenizer.decode(generated) == "".join(s.text for s in ep.steps)
        assert str(tokenizer.decode(traj.prompt_ids)).startswith("<|im_start|>system")
        if traj.logprobs is not None:
            with_logprobs += 1
            assert len(traj.logprobs) == len(traj.completion_ids)
            on_policy = [lp for lp, m in zip(traj.logprobs, traj.mask, strict=True) if m]
            assert all(lp <= 0 for lp in on_policy) and any(lp < 0 for lp in on_policy)
            assert all(lp == 0 for lp, m in zip(traj.logprobs, traj.mask, strict=True) if not m)
    # The engine's own ids match the canonical tokenization in the common case.
    assert with_logprobs >= 1


def test_seeded_rollouts_repeat(policy_url: str) -> None:
    sampling = {
        "shape": shape(max_steps=1, max_new_tokens_per_step=12, token_budget=1024, temperature=1.0),
        "seed": 3,
    }
    with PolicyClient(policy_url) as policy:
        first, again = (
            policy.rollouts(QUESTIONS[:1], "search-r1", COLLECTION, sampling=sampling) for _ in "ab"
        )
    assert [r.episode.steps for r in again.rollouts] == [r.episode.steps for r in first.rollouts]
    assert again.rollouts[0].trajectory == first.rollouts[0].trajectory


def test_rollouts_reject_too_many_and_bad_limits(policy_url: str) -> None:
    one_step = {
        "shape": shape(max_steps=1, max_new_tokens_per_step=8, token_budget=64).model_dump(mode="json")
    }
    body = {"questions": [q.model_dump() for q in QUESTIONS], "recipe": "search-r1", "collection": COLLECTION,
            "sampling": one_step}  # fmt: skip
    too_many = httpx.post(f"{policy_url}/v1/rollouts", json={**body, "n_samples": 5})
    assert too_many.status_code == 409 and too_many.json()["error"] == "batch_too_large"
    too_long = shape(max_steps=1, max_new_tokens_per_step=999, token_budget=1024).model_dump(mode="json")
    long_steps = httpx.post(f"{policy_url}/v1/rollouts", json={**body, "sampling": {"shape": too_long}})
    assert long_steps.status_code == 422 and "POLICY_MAX_NEW_TOKENS_PER_STEP" in long_steps.json()["message"]
    unknown = httpx.post(f"{policy_url}/v1/rollouts", json={**body, "recipe": "nope"})
    shapeless = httpx.post(f"{policy_url}/v1/rollouts", json={**body, "sampling": {}})
    assert shapeless.status_code == 422 and "shape" in shapeless.text  # a run's own shape, never a default
    assert unknown.status_code == 422 and unknown.json()["error"] == "unknown_recipe"
