"""Answer evaluation through the policy service: EM / F1, retrieval count and latency per recipe.

Every question goes through ``POST /v1/answer`` exactly as an application would send it, so the
numbers include the agent loop, the retriever round trips and the HTTP overhead. With
``repeatable=True`` the questions go through ``POST /v1/answer/batch`` instead, in fixed chunks of
``batch_size``, one chunk after the other: each chunk is decoded greedily in lock-step rounds, so
the same checkpoint and index give the same answers on every run (latency is then each episode's
own time, not a round trip's).

    >>> report = evaluate_answers("http://127.0.0.1:8002", "http://127.0.0.1:8001",
    ...                           load_questions("../shared/data/hotpotqa_dev.jsonl"),
    ...                           recipe="naive-rag", limit=200)  # doctest: +SKIP
    >>> report["em"], report["f1"], report["latency_p50_s"]  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from hoprl.clients.policy import AsyncPolicyClient, ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import gold_ids, pool
from hoprl.evaluation import corpus_collection, ensure_indexed, progress
from hoprl.metrics.answer import exact_match, f1
from hoprl.metrics.retrieval import agent_retrieval
from hoprl.schemas import Question
from hoprl.schemas.policy import AnswerResponse

#: outcomes that end an episode by the recipe's own final action
ENDINGS = ("answer", "refuse", "stop")


def prepare_collection(retriever_url: str, questions: Sequence[Question], name: str = "eval") -> str:
    """Index the pooled paragraphs of ``questions`` (the benchmark's corpus) unless already there."""
    documents = pool(questions)
    collection = corpus_collection(name, documents)
    with RetrieverClient(retriever_url) as client:
        ensure_indexed(client, collection, documents)
    return collection


def retrieved_ids(reply: AnswerResponse | None) -> list[str]:
    """The paragraph ids an answer's trace retrieved, in the order they came back (a chunk
    ``<doc id>#<n>`` counts as its paragraph), each once."""
    steps = (reply.steps or []) if reply is not None else []
    return list(dict.fromkeys(d.id.split("#")[0] for s in steps for docs in s.docs for d in docs))


def _score(
    question: Question, reply: AnswerResponse | None, error: str | None, latency: float
) -> dict[str, Any]:
    prediction = reply.answer if reply is not None else None
    return {
        "id": question.id,
        "prediction": prediction,
        "answers": question.answers,
        "em": exact_match(prediction or "", question.answers),
        "f1": f1(prediction or "", question.answers),
        "retrievals": sum(len(s.queries) for s in (reply.steps or [])) if reply else 0,
        "queries": [q for s in (reply.steps or []) for q in s.queries] if reply else [],
        "outcome": reply.outcome if reply else "error",
        "constrained": reply.constrained if reply else False,
        "latency_s": latency,
        "retrieval_s": reply.timings.retrieval_s if reply else 0.0,
        "generation_s": reply.timings.generation_s if reply else 0.0,
        "error": error,
        "retrieved": retrieved_ids(reply),
        "gold": sorted(gold_ids(question)),
    }


async def _answer_all(
    url: str, questions: Sequence[Question], recipe: str, collection: str, concurrency: int, timeout_s: float
) -> list[dict[str, Any]]:
    client = AsyncPolicyClient(url, timeout=timeout_s)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(question: Question) -> dict[str, Any]:
        async with semaphore:
            start = time.perf_counter()
            try:
                reply = await client.answer(question.question, recipe, collection, return_trace=True)
                row = _score(question, reply, None, time.perf_counter() - start)
            except (ServiceError, httpx.TransportError) as exc:  # a failed question, not a failed run
                row = _score(question, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
            bar.advance(task)
            return row

    with progress() as bar:
        task = bar.add_task(f"answering ({recipe})", total=len(questions))
        try:
            return list(await asyncio.gather(*(one(q) for q in questions)))
        finally:
            await client.aclose()


async def _answer_batches(
    url: str, questions: Sequence[Question], recipe: str, collection: str, batch_size: int, timeout_s: float
) -> list[dict[str, Any]]:
    """``questions`` in chunks of ``batch_size`` through ``/v1/answer/batch``, one chunk at a time
    (the chunks, hence the lock-step rounds, depend on the questions alone)."""
    client, rows = AsyncPolicyClient(url, timeout=timeout_s), []
    with progress() as bar:
        task = bar.add_task(f"answering ({recipe}, lock-step)", total=len(questions))
        try:
            for i in range(0, len(questions), batch_size):
                chunk = questions[i : i + batch_size]
                try:
                    batch = await client.answer_batch([q.question for q in chunk], recipe, collection,
                                                      return_trace=True)  # fmt: skip
                    rows += [
                        _score(q, a, None, a.timings.total_s)
                        for q, a in zip(chunk, batch.answers, strict=True)
                    ]
                except (ServiceError, httpx.TransportError) as exc:  # failed questions, not a failed run
                    rows += [_score(q, None, f"{type(exc).__name__}: {exc}", 0.0) for q in chunk]
                bar.advance(task, len(chunk))
        finally:
            await client.aclose()
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of EM / F1 / retrievals, latency percentiles, outcome counts, the agent's retrieval.

    ``ended``: the share of questions whose episode ended with the recipe's own final action (an
    answer, a refusal, or R2AG's stop), not a format error, a step or token cap, or an error.
    ``constrained``: the share answered under the recipe's action grammar.
    ``agent_recall`` / ``agent_full_recall`` / ``agent_map`` at ``agent_k``: what the episodes
    themselves retrieved (:func:`hoprl.metrics.retrieval.agent_retrieval`), over questions with gold.
    ``retrieval_s`` / ``generation_s``: the mean time per question spent retrieving and generating
    (R2AG's T_r / T_g).
    """
    latency = np.array([r["latency_s"] for r in rows]) if rows else np.zeros(1)

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows])) if rows else 0.0

    return {
        "questions": len(rows),
        "em": mean("em"),
        "f1": mean("f1"),
        "retrieval_count": mean("retrievals"),
        "latency_p50_s": float(np.percentile(latency, 50)),
        "latency_p99_s": float(np.percentile(latency, 99)),
        "retrieval_s": mean("retrieval_s"),
        "generation_s": mean("generation_s"),
        "errors": sum(r["error"] is not None for r in rows),
        "ended": float(np.mean([r["outcome"] in ENDINGS for r in rows])) if rows else 0.0,
        "constrained": mean("constrained"),
        "outcomes": dict(Counter(r["outcome"] for r in rows)),
        **agent_retrieval([r["retrieved"] for r in rows], [set(r["gold"]) for r in rows]),
    }


def evaluate_answers(
    policy_url: str,
    retriever_url: str,
    questions: Sequence[Question],
    recipe: str = "naive-rag",
    collection: str | None = None,
    limit: int | None = None,
    concurrency: int = 4,
    timeout_s: float = 7200.0,
    repeatable: bool = False,
    batch_size: int = 16,
) -> dict[str, Any]:
    """EM / F1 / retrieval count / latency of ``recipe`` answering ``questions[:limit]``.

    Args:
        policy_url: the policy service's base URL; its POLICY_RETRIEVER_URL must be ``retriever_url``
            (``hoprl eval-answers``, given no URLs, starts both in-process).
        collection: the retriever collection; ``None`` = index the pooled paragraphs of all
            ``questions`` (the benchmark's corpus; cached by content, see ``corpus_collection``).
        concurrency: questions in flight at once (the policy batches concurrent generations).
        timeout_s: how long the client waits for one answer. The service bounds each request by its
            own POLICY_REQUEST_TIMEOUT_S (a 504, counted as an error); this only has to be longer,
            since a loaded CPU can queue a question behind many others.
        repeatable: answer through ``/v1/answer/batch`` in lock-step rounds (greedy, the same
            answers on every run against the same checkpoint and index), ``batch_size`` questions a
            request (at most the policy's POLICY_MAX_ROLLOUTS; each request must also finish within
            its POLICY_REQUEST_TIMEOUT_S); ``concurrency`` is then unused.

    Returns the summary (``em``, ``f1``, ``retrieval_count``, ``latency_p50_s``, ...) with
    ``recipe``, ``collection``, ``seconds`` and per-question ``predictions``.
    """
    collection = collection or prepare_collection(retriever_url, questions)
    sample = list(questions[:limit] if limit else questions)
    start = time.perf_counter()
    if repeatable:
        rows = asyncio.run(_answer_batches(policy_url, sample, recipe, collection, batch_size, timeout_s))
    else:
        rows = asyncio.run(_answer_all(policy_url, sample, recipe, collection, concurrency, timeout_s))
    seconds = time.perf_counter() - start
    return {
        "recipe": recipe,
        "collection": collection,
        "repeatable": repeatable,
        **summarize(rows),
        "seconds": seconds,
        "predictions": rows,
    }
