"""HTTP routes of the policy: ``/v1/answer``, rollouts and admin, plus the OpenAI-compatible subset.

The OpenAI-compatible routes live in :mod:`services.policy.openai_routes` (OpenAI's error envelope,
streaming as decoded); the project's own routes here answer errors with the project's
``{"error", "message", "detail"}`` body. ``router`` carries both.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from hoprl.generation.model import is_checkpoint
from hoprl.schemas.policy import (
    AnswerRequest,
    AnswerResponse,
    CheckpointRequest,
    CheckpointResponse,
    RolloutRequest,
    RolloutResponse,
)
from services.errors import ERROR_RESPONSES, ApiError
from services.policy.openai_routes import PolicyDep, openai_router

POLICY_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    **{
        code: {**ERROR_RESPONSES[422], "description": text}
        for code, text in {
            409: "within the schema, but over a limit of this service (questions x n_samples)",
            429: "too many generation requests in flight",
            502: "the retriever answered with an error",
            504: "the request ran past POLICY_REQUEST_TIMEOUT_S",
        }.items()
    },
}
hoprl_router = APIRouter(responses=POLICY_ERRORS)


@hoprl_router.post("/v1/answer", operation_id="answer")
async def answer(body: AnswerRequest, policy: PolicyDep) -> AnswerResponse:
    """Answer a question with a recipe's agent loop against the retriever: answer, citations, trace."""
    return await policy.answer(body)


@hoprl_router.post("/v1/rollouts", operation_id="rollouts")
async def rollouts(body: RolloutRequest, policy: PolicyDep) -> RolloutResponse:
    """Questions x n_samples episodes as token-level trajectories (masks, log-probs) for training."""
    start = time.perf_counter()
    out = await policy.rollouts(body)
    return RolloutResponse(
        recipe=body.recipe, model=policy.model_id, rollouts=out, took_s=time.perf_counter() - start
    )


@hoprl_router.post(
    "/v1/admin/checkpoint",
    operation_id="switch_checkpoint",
    response_model=CheckpointResponse,
    responses={
        401: ERROR_RESPONSES[422] | {"description": "no bearer token"},
        403: ERROR_RESPONSES[422] | {"description": "wrong token or admin disabled"},
    },
)
async def switch_checkpoint(body: CheckpointRequest, policy: PolicyDep) -> Any:
    """Load another checkpoint and serve it without a restart (``Authorization: Bearer <token>``).

    The token (POLICY_ADMIN_TOKEN) is checked by :class:`services.security.ApiKeyMiddleware`
    before the body is read, so a caller without it learns nothing of this route's shape."""
    path = body.path
    if policy.settings.engine != "openai":
        folder = Path(path).expanduser()
        if not folder.exists():
            raise ApiError(
                404, "checkpoint_not_found", f"no such checkpoint folder on the policy's machine: {path!r}"
            )
        if not folder.is_dir() or not is_checkpoint(folder):
            raise ApiError(
                422, "not_a_checkpoint", f"{path!r} holds no config.json and weights (save_pretrained output)"
            )
        path = str(folder.resolve())
    start = time.perf_counter()
    try:
        await run_in_threadpool(policy.engine.load, path)
    except Exception as exc:  # a broken checkpoint is the caller's problem; the old weights stay
        raise ApiError(422, "checkpoint_load_failed", f"could not load {path!r}: {exc}") from None
    return CheckpointResponse(
        model=policy.model_id, root=policy.engine.model_path, took_s=time.perf_counter() - start
    )


router = APIRouter()
router.include_router(openai_router)
router.include_router(hoprl_router)
