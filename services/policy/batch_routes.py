"""``POST /v1/answer/batch``: questions answered together in lock-step rounds, greedily.

``/v1/answer`` decodes each request as it arrives, batched with whatever else is queued, so which
prompts share a batch (and the padding) depends on timing and near-ties can flip between two runs.
Here the episodes of one request are decoded in :class:`hoprl.generation.lockstep.Lockstep`
rounds, in question order, at temperature 0: the same request to the same checkpoint and index
gives the same answers (while nothing else asks the policy for generations at the same time).
Evaluations use it (``hoprl eval-answers --repeatable``, the ``evaluate`` flow, ``bench/train.py``).

Every item is what ``/v1/answer`` returns for the question, with the same validation: the same
limits, each question named by its index when it breaks one, and at most POLICY_MAX_ROLLOUTS
questions a request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter

from hoprl.domain import Episode, Question
from hoprl.generation.chat import EngineChat
from hoprl.generation.lockstep import Lockstep
from hoprl.schemas.policy import (
    AnswerBatchRequest,
    AnswerBatchResponse,
    AnswerRequest,
    AnswerResponse,
    Timings,
)
from services.errors import ApiError
from services.policy.agent import Policy, citations, within
from services.policy.openai_routes import PolicyDep
from services.policy.routes import POLICY_ERRORS

batch_router = APIRouter(responses=POLICY_ERRORS)


@batch_router.post("/v1/answer/batch", operation_id="answer_batch")
async def answer_batch(body: AnswerBatchRequest, policy: PolicyDep) -> AnswerBatchResponse:
    """Answer questions in lock-step rounds at temperature 0 (repeatable); items as /v1/answer's."""
    start = time.perf_counter()
    answers, rounds = await lockstep_answers(policy, body)
    return AnswerBatchResponse(answers=answers, rounds=rounds, took_s=time.perf_counter() - start)


def questions_of(policy: Policy, texts: list[str]) -> list[Question]:
    """The request's questions, stripped and checked as ``/v1/answer`` checks one (index named)."""
    s = policy.settings
    if len(texts) > s.max_rollouts:
        raise ApiError(  # 422: the published schema states the limit (maxItems)
            422, "batch_too_large",
            f"questions: {len(texts)} in one request; the limit is {s.max_rollouts} (POLICY_MAX_ROLLOUTS); "
            "send them in several requests",
        )  # fmt: skip
    out = []
    for i, text in enumerate(texts):
        question = text.strip()
        if not question:
            raise ApiError(422, "empty_question", f"questions[{i}] is empty; send at least one word")
        if len(question) > s.max_question_chars:
            raise ApiError(
                422, "question_chars_too_large",
                f"questions[{i}]: question_chars={len(question)} exceeds the limit {s.max_question_chars} "
                "(POLICY_MAX_QUESTION_CHARS)",
            )  # fmt: skip
        out.append(Question(id=uuid.uuid4().hex, dataset="api", split="serve", question=question))
    return out


async def lockstep_answers(policy: Policy, body: AnswerBatchRequest) -> tuple[list[AnswerResponse], int]:
    """Every question's episode, decoded in lock-step rounds; the answers and the round count."""
    s = policy.settings
    questions = questions_of(policy, body.questions)
    recipe = policy.recipe(body.recipe or s.default_recipe)
    if body.max_steps is not None:
        policy.bounded("max_steps", body.max_steps, s.max_steps, "POLICY_MAX_STEPS")
    collection = body.collection or s.default_collection
    await policy.check_collection(collection)
    one = AnswerRequest(
        question=questions[0].question,
        max_steps=body.max_steps,
        constrained=body.constrained,
        shape=body.shape,
    )
    shape, limited = policy.answer_shape(one)
    shape = shape.greedy()  # lock-step rounds are repeatable only greedy
    constraint = policy.constraint(one, recipe, shape)
    deadline = time.monotonic() + s.request_timeout_s
    rounds = Lockstep(policy.engine, len(questions))
    chats = [rounds.chat(i, deadline=deadline, constraint=constraint) for i in range(len(questions))]
    options: dict[str, Any] = {"shape": shape}
    with policy.admitted():
        work = asyncio.gather(*(
            rounds.run(i, policy.episode(recipe, q, collection, chats[i], **options))
            for i, q in enumerate(questions)
        ))  # fmt: skip
        episodes = await within(s.request_timeout_s, work)
    answers = [
        response(policy, ep, chat, recipe, q, body.return_trace).model_copy(
            update={"shape": shape.model_copy(update={"grammar": constraint is not None}), "limited": limited}
        )
        for ep, chat, q in zip(episodes, chats, questions, strict=True)
    ]
    return answers, len(rounds.rounds)


def response(
    policy: Policy, ep: Episode, chat: EngineChat, recipe: Any, question: Question, trace: bool
) -> AnswerResponse:
    """The ``/v1/answer`` reply for one episode."""
    constrained = bool(chat.grammars) and None not in chat.grammars
    return AnswerResponse(
        answer=ep.final_answer,
        refused=ep.refused,
        citations=citations(ep, recipe, question),
        steps=ep.steps if trace else None,
        timings=Timings(
            retrieval_s=ep.timings.get("retrieval", 0.0),
            generation_s=ep.timings.get("generation", 0.0),
            total_s=ep.timings.get("total", 0.0),
        ),
        recipe=recipe.name,
        outcome=ep.outcome,
        model=policy.model_id,
        constrained=constrained,
        grammar=chat.grammars[0] if constrained else None,
    )
