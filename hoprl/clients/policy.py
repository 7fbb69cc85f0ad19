"""Typed HTTP clients for the policy service's own routes (sync and async).

Requests and replies are the service's own models (:mod:`hoprl.schemas.policy`).

The OpenAI-compatible routes need no client of ours: use the ``openai`` package, or
:class:`hoprl.clients.llm.LLMClient` for the agent loop.

    >>> with PolicyClient("http://127.0.0.1:8002") as policy:  # doctest: +SKIP
    ...     reply = policy.answer("Who founded Acme Records?", collection="tiny")
    ...     reply.answer, [c.doc_id for c in reply.citations]
"""

from __future__ import annotations

from typing import Any, TypedDict, Unpack

import httpx

from hoprl.clients.http import ServiceClient, ServiceError, client_options
from hoprl.clients.http import check as _check
from hoprl.domain import EpisodeShape, Question
from hoprl.schemas.policy import AnswerBatchResponse, AnswerResponse, CheckpointResponse, RolloutResponse


class BatchFields(TypedDict, total=False):
    """The optional fields of ``POST /v1/answer/batch`` besides the recipe and the collection (one left
    out, or None, takes the service's default: :class:`hoprl.schemas.policy.AnswerBatchRequest`)."""

    shape: EpisodeShape | None
    max_steps: int | None
    return_trace: bool
    constrained: bool | None


class AnswerFields(BatchFields, total=False):
    """The optional fields of ``POST /v1/answer`` besides the recipe and the collection: the batch's,
    and sampling (:class:`hoprl.schemas.policy.AnswerRequest`)."""

    temperature: float
    top_p: float
    seed: int | None
    paragraphs: list[dict[str, Any]]


class RolloutFields(TypedDict, total=False):
    """``n_samples`` (episodes per question, 1 when left out) and ``sampling``: ``shape`` (the run's
    :class:`~hoprl.domain.EpisodeShape`), ``top_p``, ``seed``."""

    n_samples: int
    sampling: dict[str, Any] | None


def _body(
    key: str, value: Any, recipe: str | None, collection: str | None, fields: BatchFields
) -> dict[str, Any]:
    """``{key: value}`` and every field that is not None."""
    given = {"recipe": recipe, "collection": collection, **fields}
    return {key: value, **_json(given)}


def _json(fields: dict[str, Any]) -> dict[str, Any]:
    """A request's set fields as JSON (an episode shape as its fields)."""
    return {k: v.model_dump(mode="json") if isinstance(v, EpisodeShape) else v for k, v in fields.items()
            if v is not None}  # fmt: skip


def _rollouts_body(
    questions: list[Question], recipe: str, collection: str, fields: RolloutFields
) -> dict[str, Any]:
    return {
        "questions": [q.model_dump() for q in questions],
        "recipe": recipe,
        "collection": collection,
        "n_samples": fields.get("n_samples", 1),
        "sampling": _json(fields.get("sampling") or {}),
    }


class PolicyClient(ServiceClient):
    """Blocking client: ``answer``, ``answer_batch``, ``rollouts``, ``switch_checkpoint``.

    Args:
        admin_token: bearer token for :meth:`switch_checkpoint` (the service's POLICY_ADMIN_TOKEN).
        timeout: seconds per request; generation on a CPU is slow, so it is generous.
    """

    def __init__(
        self, base_url: str, admin_token: str | None = None, timeout: float = 300.0, **kwargs: Any
    ) -> None:
        self.admin_token = admin_token
        super().__init__(base_url, timeout, **kwargs)

    def answer(self, question: str, recipe: str | None = None, collection: str | None = None,
               **fields: Unpack[AnswerFields]) -> AnswerResponse:  # fmt: skip
        """``fields``: :class:`AnswerFields` (``return_trace``, ``temperature``, ``paragraphs``...)."""
        body = _body("question", question, recipe, collection, fields)
        return AnswerResponse.model_validate(_check(self.http.post("/v1/answer", json=body)))

    def answer_batch(self, questions: list[str], recipe: str | None = None, collection: str | None = None,
                     **fields: Unpack[BatchFields]) -> AnswerBatchResponse:  # fmt: skip
        """Answer ``questions`` together in lock-step rounds, greedily: the same request to the same
        checkpoint and index gives the same answers (``POST /v1/answer/batch``)."""
        body = _body("questions", questions, recipe, collection, fields)
        return AnswerBatchResponse.model_validate(_check(self.http.post("/v1/answer/batch", json=body)))

    def rollouts(self, questions: list[Question], recipe: str, collection: str,
                 **fields: Unpack[RolloutFields]) -> RolloutResponse:  # fmt: skip
        """``fields``: :class:`RolloutFields` (``n_samples``, ``sampling``)."""
        body = _rollouts_body(questions, recipe, collection, fields)
        return RolloutResponse.model_validate(_check(self.http.post("/v1/rollouts", json=body)))

    def switch_checkpoint(self, path: str) -> CheckpointResponse:
        """Serve the checkpoint folder ``path`` (on the service's machine) from now on."""
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        response = self.http.post("/v1/admin/checkpoint", json={"path": path}, headers=headers)
        return CheckpointResponse.model_validate(_check(response))

    def model(self) -> str:
        """The id of the served model (``GET /v1/models``)."""
        return str(_check(self.http.get("/v1/models"))["data"][0]["id"])


class AsyncPolicyClient:
    """Async client for fan-out (evaluation, rollout collection)."""

    def __init__(
        self, base_url: str, admin_token: str | None = None, timeout: float = 300.0, **kwargs: Any
    ) -> None:
        self.admin_token = admin_token
        self.http = httpx.AsyncClient(base_url=base_url, **client_options(timeout, kwargs))

    async def answer(self, question: str, recipe: str | None = None, collection: str | None = None,
                     **fields: Unpack[AnswerFields]) -> AnswerResponse:  # fmt: skip
        body = _body("question", question, recipe, collection, fields)
        return AnswerResponse.model_validate(_check(await self.http.post("/v1/answer", json=body)))

    async def answer_batch(self, questions: list[str], recipe: str | None = None,
                           collection: str | None = None,
                           **fields: Unpack[BatchFields]) -> AnswerBatchResponse:  # fmt: skip
        body = _body("questions", questions, recipe, collection, fields)
        response = await self.http.post("/v1/answer/batch", json=body)
        return AnswerBatchResponse.model_validate(_check(response))

    async def rollouts(self, questions: list[Question], recipe: str, collection: str,
                       **fields: Unpack[RolloutFields]) -> RolloutResponse:  # fmt: skip
        body = _rollouts_body(questions, recipe, collection, fields)
        return RolloutResponse.model_validate(_check(await self.http.post("/v1/rollouts", json=body)))

    async def switch_checkpoint(self, path: str) -> CheckpointResponse:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        response = await self.http.post("/v1/admin/checkpoint", json={"path": path}, headers=headers)
        return CheckpointResponse.model_validate(_check(response))

    async def aclose(self) -> None:
        await self.http.aclose()


__all__ = [
    "AnswerFields",
    "AsyncPolicyClient",
    "BatchFields",
    "PolicyClient",
    "RolloutFields",
    "ServiceError",
]
