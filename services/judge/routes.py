"""HTTP routes of the judge (``/v1/judge/...``, batched, cached, typed responses, declared errors)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel
from redis.exceptions import RedisError

from hoprl.schemas.judge import (
    AnswerableItem,
    AnswerableRequest,
    AnswerItem,
    AnswerRequest,
    JudgeVerdict,
    VerdictsResponse,
)
from services.errors import ERROR_RESPONSES, ApiError
from services.judge.backends import Backend
from services.judge.cache import VerdictCache, cache_key

router = APIRouter(responses=ERROR_RESPONSES)
Item = TypeVar("Item", AnswerItem, AnswerableItem)


def _check_batch(items: Sequence[BaseModel], request: Request) -> None:
    limit: int = request.app.state.settings.max_batch
    if len(items) > limit:
        raise ApiError(
            413,
            "batch_too_large",
            f"{len(items)} items in one request; the limit is {limit} (JUDGE_MAX_BATCH)",
        )


async def _judge(
    kind: str,
    items: list[Item],
    judge: Callable[[list[Item]], Awaitable[list[JudgeVerdict]]],
    version: str,
    request: Request,
) -> VerdictsResponse:
    """Serve cached verdicts, judge the rest in one backend batch, cache what the backend decided."""
    backend: Backend = request.app.state.backend
    cache: VerdictCache = request.app.state.cache
    keys = [cache_key(backend.name, backend.model, version, kind, i.model_dump()) for i in items]
    try:
        stored = await cache.get_many(keys)
    except RedisError as exc:
        raise ApiError(503, "cache_unavailable", f"Redis did not answer: {exc}") from None
    verdicts: list[JudgeVerdict | None] = [
        None if s is None else JudgeVerdict.model_validate(s | {"cached": True}) for s in stored
    ]
    # One backend call per distinct missing input, even when a batch repeats an item.
    missing = {keys[i]: i for i, v in reversed(list(enumerate(verdicts))) if v is None}
    fresh = dict(zip(missing, await judge([items[i] for i in missing.values()]), strict=True))
    for i, key in enumerate(keys):
        verdicts[i] = verdicts[i] or fresh[key]
    # A fallback is not the configured backend's answer: ask the backend again next time.
    new: dict[str, dict[str, Any]] = {k: v.model_dump() for k, v in fresh.items() if not v.fallback}
    try:
        await cache.set_many(new)
    except RedisError as exc:
        raise ApiError(503, "cache_unavailable", f"Redis did not answer: {exc}") from None
    return VerdictsResponse(verdicts=[v for v in verdicts if v is not None])


@router.post("/v1/judge/answer", operation_id="judge_answer")
async def judge_answer(body: AnswerRequest, request: Request) -> VerdictsResponse:
    """Is each prediction the same answer as one of its references? One verdict per item, in order.

    ``score`` is the token F1 for the rules backend and 1/0 for an LLM verdict; ``version`` names
    the rules or the prompt that decided (e.g. ``answer_equivalence@1``).
    """
    _check_batch(body.items, request)
    backend: Backend = request.app.state.backend
    return await _judge("answer", body.items, backend.answer, backend.answer_version, request)


@router.post("/v1/judge/answerable", operation_id="judge_answerable")
async def judge_answerable(body: AnswerableRequest, request: Request) -> VerdictsResponse:
    """Can each question be answered from its evidence alone? (EVO-RAG's refusal check.)

    With ``references`` the rules look for a reference answer in the evidence (``[]`` means the
    question has no answer, so it is not answerable); without, for the question's content words.
    """
    _check_batch(body.items, request)
    backend: Backend = request.app.state.backend
    return await _judge("answerable", body.items, backend.answerable, backend.answerable_version, request)
