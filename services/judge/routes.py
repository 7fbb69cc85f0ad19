"""HTTP routes of the judge (``/v1/judge/...``, batched, cached, typed responses, declared errors)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
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
from services.errors import ERROR_RESPONSES, ApiError, state_of
from services.judge.backends import Backend
from services.judge.cache import VerdictCache, cache_key
from services.judge.settings import JudgeSettings

router = APIRouter(responses=ERROR_RESPONSES)
Item = TypeVar("Item", AnswerItem, AnswerableItem)


# The lifespan's state, as dependencies: a test can hand the routes another backend or cache
# (app.dependency_overrides); async, so resolving them takes no thread from the pool.


backend_of = state_of("backend", "the judge is still starting")  # the backend the lifespan made
cache_of = state_of("cache", "the judge is still starting")  # the verdict cache it opened


async def settings_of(request: Request) -> JudgeSettings:
    settings: JudgeSettings = request.app.state.settings
    return settings


BackendDep = Annotated[Backend, Depends(backend_of)]
CacheDep = Annotated[VerdictCache, Depends(cache_of)]
SettingsDep = Annotated[JudgeSettings, Depends(settings_of)]


def _check_batch(items: Sequence[BaseModel], limit: int) -> None:
    if len(items) > limit:
        raise ApiError(  # 422: the published schema states JUDGE_MAX_BATCH (maxItems)
            422,
            "batch_too_large",
            f"items: {len(items)} in one request; the limit is {limit} (JUDGE_MAX_BATCH)",
        )


async def _judge(
    kind: str,
    items: list[Item],
    judge: Callable[[list[Item]], Awaitable[list[JudgeVerdict]]],
    version: str,
    backend: Backend,
    cache: VerdictCache,
) -> VerdictsResponse:
    """Serve cached verdicts, judge the rest in one backend batch, cache what the backend decided."""
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
async def judge_answer(
    body: AnswerRequest, backend: BackendDep, cache: CacheDep, settings: SettingsDep
) -> VerdictsResponse:
    """Is each prediction the same answer as one of its references? One verdict per item, in order.

    ``score`` is the token F1 for the rules backend and 1/0 for an LLM verdict; ``version`` names
    the rules or the prompt that decided (e.g. ``answer_equivalence@1``).
    """
    _check_batch(body.items, settings.max_batch)
    return await _judge("answer", body.items, backend.answer, backend.answer_version, backend, cache)


@router.post("/v1/judge/answerable", operation_id="judge_answerable")
async def judge_answerable(
    body: AnswerableRequest, backend: BackendDep, cache: CacheDep, settings: SettingsDep
) -> VerdictsResponse:
    """Can each question be answered from its evidence alone? (EVO-RAG's refusal check.)

    With ``references`` the rules look for a reference answer in the evidence (``[]`` means the
    question has no answer, so it is not answerable); without, for the question's content words.
    """
    _check_batch(body.items, settings.max_batch)
    version = backend.answerable_version
    return await _judge("answerable", body.items, backend.answerable, version, backend, cache)
