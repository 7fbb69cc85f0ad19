"""``POST /v1/rollouts`` limits: every size a request controls is bounded by a named ``POLICY_*`` setting.

The policy fixture's limits (``conftest.small_settings``): 8 rollouts, 300 question characters and
4,000 prompt characters per request.
"""

from __future__ import annotations

from typing import Any

import httpx

from hoprl.domain import Paragraph, Question

from .conftest import COLLECTION

#: a rollout's episode: within the service's limits (small_settings: 3 steps, 24 tokens, 1,024)
SHAPE = {"max_steps": 1, "max_new_tokens_per_step": 8, "token_budget": 64}


def rollouts(policy_url: str, questions: list[Question], **fields: Any) -> httpx.Response:
    body = {"questions": [q.model_dump() for q in questions], "recipe": "arena", "collection": COLLECTION,
            "sampling": {"shape": SHAPE}}  # fmt: skip
    return httpx.post(f"{policy_url}/v1/rollouts", json={**body, **fields}, timeout=60)


def question(text: str = "Who founded Acme Records?", paragraphs: int = 0, chars: int = 0) -> Question:
    refs = [Paragraph(title=f"p{i}", text="x" * chars) for i in range(paragraphs)]
    return Question(id="q", dataset="tiny", split="dev", question=text, answers=["Jane Roe"], paragraphs=refs)


def test_rollout_sizes_are_bounded_by_named_settings(policy_url: str) -> None:
    too_many = rollouts(policy_url, [question()] * 3, n_samples=3)  # 9 episodes > 8, each factor <= 8
    assert too_many.status_code == 409 and "POLICY_MAX_ROLLOUTS" in too_many.json()["message"]
    too_many_samples = rollouts(policy_url, [question()], n_samples=9)  # past the schema's maximum
    assert too_many_samples.status_code == 422 and "POLICY_MAX_ROLLOUTS" in too_many_samples.json()["message"]
    long_question = rollouts(policy_url, [question("why? " * 61)])  # 305 characters > 300
    body = long_question.json()
    assert (long_question.status_code, body["error"]) == (422, "question_chars_too_large")
    assert "POLICY_MAX_QUESTION_CHARS" in body["message"]
    # ARENA reads a question's own paragraphs into its prompt: 2 x (2 + 2,000) + 25 > 4,000 characters
    long_prompt = rollouts(policy_url, [question(paragraphs=2, chars=2000)])
    body = long_prompt.json()
    assert (long_prompt.status_code, body["error"]) == (422, "prompt_chars_too_large")
    assert "POLICY_MAX_PROMPT_CHARS" in body["message"]
