"""The judge service's typed HTTP client, and :class:`RemoteJudge`.

Requests and replies are the service's own models (:mod:`hoprl.schemas.judge`).

:class:`RemoteJudge` implements :class:`hoprl.judging.Judge` over HTTP, so code written against
the protocol (EVO-RAG's refusal reward, an LLM-judge metric) switches from the embedded
:class:`~hoprl.judging.RulesJudge` to the judge service without changes::

    judge = RemoteJudge("http://127.0.0.1:8003")
    judge.answer("Eiffel Tower", ["The Eiffel Tower"]).verdict   # True

For many items at once, use :class:`JudgeClient` (one HTTP request per batch).

When the service cannot be reached (refused or dropped connection, timeout, a 5xx answer),
:class:`RemoteJudge` decides with the embedded :class:`~hoprl.judging.RulesJudge` instead of
raising, and says so in the verdict (``fallback=True``, ``fallback_reason``) and in a warning:
a training run whose judge died keeps going with rules verdicts it can tell apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx

from hoprl.clients.http import ServiceClient, ServiceError, client_options
from hoprl.clients.http import check as _check
from hoprl.judging import RulesJudge, Verdict
from hoprl.schemas.judge import AnswerableItem, AnswerItem, JudgeVerdict, VerdictsResponse

log = logging.getLogger("hoprl.clients.judge")


def _body(items: list[AnswerItem] | list[AnswerableItem]) -> dict[str, Any]:
    return {"items": [item.model_dump() for item in items]}


def _verdicts(response: httpx.Response) -> list[JudgeVerdict]:
    """The verdicts of a batch reply; raises :class:`ServiceError` on a 4xx/5xx answer."""
    return VerdictsResponse.model_validate(_check(response)).verdicts


class JudgeClient(ServiceClient):
    """Blocking client: ``JudgeClient(url).answer([AnswerItem(prediction=..., references=[...])])``."""

    def __init__(self, base_url: str, timeout: float = 120.0, **kwargs: Any) -> None:
        super().__init__(base_url, timeout, **kwargs)

    def answer(self, items: list[AnswerItem]) -> list[JudgeVerdict]:
        """Grade a batch of predictions; raises :class:`ServiceError` on a 4xx/5xx answer."""
        return _verdicts(self.http.post("/v1/judge/answer", json=_body(items)))

    def answerable(self, items: list[AnswerableItem]) -> list[JudgeVerdict]:
        """Decide answerability for a batch of questions."""
        return _verdicts(self.http.post("/v1/judge/answerable", json=_body(items)))


class AsyncJudgeClient:
    """Async client for evaluation loops: ``await client.answer(items)``."""

    def __init__(self, base_url: str, timeout: float = 120.0, **kwargs: Any) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, **client_options(timeout, kwargs))

    async def answer(self, items: list[AnswerItem]) -> list[JudgeVerdict]:
        return _verdicts(await self.http.post("/v1/judge/answer", json=_body(items)))

    async def answerable(self, items: list[AnswerableItem]) -> list[JudgeVerdict]:
        return _verdicts(await self.http.post("/v1/judge/answerable", json=_body(items)))

    async def aclose(self) -> None:
        await self.http.aclose()


class RemoteJudge:
    """:class:`hoprl.judging.Judge` backed by the judge service (one request per call).

    The verdicts are :class:`JudgeVerdict` (a ``Verdict`` subclass), so callers that record
    ``verdict.model_dump()`` also keep ``cached`` and ``fallback``. Unlike ``RulesJudge``,
    :meth:`answer` with no references raises ``ValueError`` (the service answers such an item
    with HTTP 422): an answer cannot be graded without a reference.

    When the service is unreachable (any :class:`httpx.TransportError`: connection refused or
    reset, a timeout, a server that died mid-response) or answers 5xx, the verdict comes from
    ``fallback`` (the rules judge) with ``fallback=True`` and the reason; a warning is logged when
    the service goes away and an info line when it answers again. A 4xx (a bad item, a wrong API
    key) still raises :class:`~hoprl.clients.http.ServiceError`: the rules cannot fix a request.

    Args:
        base_url: the judge service, e.g. ``http://127.0.0.1:8003``; or pass ``client``.
        fallback: the judge to decide when the service cannot (default ``RulesJudge()``).
    """

    def __init__(
        self,
        base_url: str | None = None,
        client: JudgeClient | None = None,
        fallback: RulesJudge | None = None,
    ) -> None:
        if client is None and base_url is None:
            raise ValueError("RemoteJudge needs base_url (e.g. 'http://127.0.0.1:8003') or client")
        self.client = client or JudgeClient(str(base_url))
        self.fallback = fallback or RulesJudge()
        self.down: str | None = None  # the reason while the service is unreachable

    def answer(self, prediction: str, references: list[str], question: str = "") -> Verdict:
        item = AnswerItem(question=question, prediction=prediction, references=references)
        return self._decide(
            lambda: self.client.answer([item])[0],
            lambda: self.fallback.answer(prediction, references, question),
        )

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        item = AnswerableItem(question=question, evidence=evidence, references=references)
        return self._decide(
            lambda: self.client.answerable([item])[0],
            lambda: self.fallback.answerable(question, evidence, references),
        )

    def _decide(self, remote: Callable[[], JudgeVerdict], rules: Callable[[], Verdict]) -> Verdict:
        """The service's verdict, or the rules' (marked as a fallback) when it cannot give one."""
        try:
            verdict = remote()
        except (httpx.TransportError, ServiceError) as exc:
            reason = self._unreachable(exc)
            return _fell_back(rules(), reason)
        return self._back(verdict)

    def _unreachable(self, exc: httpx.TransportError | ServiceError) -> str:
        """Why the service gave no verdict; re-raises a 4xx, which the rules cannot fix."""
        if isinstance(exc, ServiceError) and exc.status < 500:
            raise exc
        what = f"HTTP {exc.status}" if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
        reason = f"judge service at {self.client.http.base_url} unavailable ({what}); the rules decided"
        if self.down is None:
            log.warning("%s; later verdicts fall back to the rules until it answers again", reason)
        self.down = reason
        return reason

    def _back(self, verdict: JudgeVerdict) -> JudgeVerdict:
        if self.down is not None:
            log.info("judge service at %s answers again", self.client.http.base_url)
            self.down = None
        return verdict

    def close(self) -> None:
        self.client.close()


def _fell_back(verdict: Verdict, reason: str) -> JudgeVerdict:
    return JudgeVerdict.model_validate(verdict.model_dump() | {"fallback": True, "fallback_reason": reason})
