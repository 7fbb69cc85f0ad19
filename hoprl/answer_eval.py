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
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import openai

from hoprl.clients.llm import LLMClient
from hoprl.clients.policy import AsyncPolicyClient, ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import gold_ids, pool
from hoprl.domain import EpisodeShape, Question
from hoprl.evaluation import corpus_collection, corpus_gold, ensure_indexed, gold_sets, progress
from hoprl.jobspec import protocol_shape
from hoprl.metrics.answer import exact_match, f1
from hoprl.metrics.retrieval import agent_retrieval
from hoprl.protocols import Protocol
from hoprl.recipes import get_recipe
from hoprl.schemas.policy import AnswerResponse

#: outcomes that end an episode by the recipe's own final action
ENDINGS = ("answer", "refuse", "stop")
#: what :func:`evaluate_answers` calls with each question's row as it is scored
AnswerHook = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class AnswerSettings:
    """How each question is asked beyond its text (an evaluation protocol's part of the request).

    ``shape`` (a paper protocol's episode: :func:`hoprl.jobspec.protocol_shape`) goes into each
    ``/v1/answer`` request whole, and the service answers in it (within its limits, which the reply
    names); without one, ``max_steps`` / ``temperature`` go instead (``None`` steps: the service's
    POLICY_DEFAULT_MAX_STEPS). ``top_p`` / ``seed`` go with a sampled decoding; ``references``
    sends the question's own paragraphs (ARENA answers over them); ``generator`` names the recipe
    whose prompt turns the documents an episode retrieved into the answer, through the policy's
    chat route at the same decoding (R2AG's generation step: its episodes retrieve and stop, they
    do not answer); ``recipe_config`` is sent as the request's recipe options (R2AG's top-k and top-t).
    """

    shape: EpisodeShape | None = None
    max_steps: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    references: bool = False
    generator: str | None = None
    generator_max_tokens: int = 256  # a short answer, within the default POLICY_MAX_TOKENS (512)
    recipe_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, protocol: Protocol, seed: int | None = None, dataset: str | None = None) -> AnswerSettings:
        """The protocol's request settings; ``dataset`` adds that evaluation set's recipe options."""
        return cls(
            shape=protocol_shape(protocol),
            max_steps=protocol.max_steps,
            temperature=protocol.temperature,
            top_p=protocol.top_p,
            seed=seed if protocol.temperature > 0 else None,
            references=protocol.references,
            generator=protocol.generator,
            recipe_config=protocol.config_for(dataset),
        )

    def fields(self, question: Question) -> dict[str, Any]:
        """The request's fields for ``question`` (defaults left out)."""
        out: dict[str, Any] = {"max_steps": self.max_steps}
        if self.shape is not None:
            out = {"shape": self.shape}
        if self.temperature > 0:
            out |= {"top_p": self.top_p, "seed": self.seed}
            if self.shape is None:
                out["temperature"] = self.temperature
        if self.references:
            out["paragraphs"] = [
                {"title": p.title, "text": p.text} for p in question.paragraphs
            ]  # no gold flags
        if self.recipe_config:
            out["recipe_config"] = dict(self.recipe_config)
        return out

    def as_json(self) -> dict[str, Any]:
        """The settings as a report records them (the shape as its fields)."""
        return {**self.__dict__, "shape": None if self.shape is None else self.shape.model_dump(mode="json")}

    @property
    def greedy(self) -> bool:
        """What ``/v1/answer/batch`` can serve: greedy, no references, no generation step, no
        recipe options."""
        return (
            self.temperature == 0
            and not self.references
            and self.generator is None
            and not self.recipe_config
        )


def prepare_collection(retriever_url: str, questions: Sequence[Question], name: str = "eval") -> str:
    """Index the pooled paragraphs of ``questions`` (the benchmark's corpus) unless already there."""
    documents = pool(questions)
    collection = corpus_collection(name, documents)
    with RetrieverClient(retriever_url) as client:
        ensure_indexed(client, collection, documents)
    return collection


def in_corpus(
    retriever_url: str, collection: str, questions: Sequence[Question], rows: list[dict[str, Any]]
) -> None:
    """Re-point each row's ``gold`` at the corpus ``collection``'s passages
    (:func:`hoprl.evaluation.corpus_gold`: matched by title, then text); ``gold_unmatched`` counts
    the gold paragraphs the corpus does not hold (they stay gold, never retrieved)."""
    with RetrieverClient(retriever_url) as client:
        matches = corpus_gold(client, collection, questions)
    for row, match, gold in zip(rows, matches, gold_sets(matches), strict=True):
        row["gold"] = sorted(gold)
        row["gold_unmatched"] = sum(found is None for found in match.values())


def retrieved_ids(reply: AnswerResponse | None) -> list[str]:
    """The paragraph ids an answer's trace retrieved, in the order they came back (a chunk
    ``<doc id>#<n>`` counts as its paragraph), each once."""
    steps = (reply.steps or []) if reply is not None else []
    return list(dict.fromkeys(d.id.split("#")[0] for s in steps for docs in s.docs for d in docs))


def _score(
    question: Question,
    reply: AnswerResponse | None,
    error: str | None,
    latency: float,
    generated: tuple[str | None, float] | None = None,
) -> dict[str, Any]:
    """One question's row; ``generated``: the generation step's answer and seconds, when there is one."""
    prediction = reply.answer if reply is not None else None
    if generated is not None:
        prediction = generated[0]
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
        "shape": reply.shape.model_dump(mode="json") if reply is not None and reply.shape else None,
        "limited": list(reply.limited) if reply else [],
        "latency_s": latency,
        "retrieval_s": reply.timings.retrieval_s if reply else 0.0,
        "generation_s": (reply.timings.generation_s if reply else 0.0) + (generated[1] if generated else 0.0),
        "steps": len(reply.steps or []) if reply else 0,
        "model": reply.model if reply else None,
        "error": error,
        "retrieved": retrieved_ids(reply),
        "gold": sorted(gold_ids(question)),
    }


async def generate_answer(
    llm: LLMClient, question: Question, reply: AnswerResponse, settings: AnswerSettings
) -> tuple[str | None, float]:
    """The generation step: ``settings.generator``'s prompt over the documents ``reply``'s episode
    retrieved (de-duplicated, in retrieval order), answered by the policy's own chat route at the
    protocol's decoding; returns the answer and the seconds it took."""
    assert settings.generator is not None
    recipe = get_recipe(settings.generator)
    docs = [[d for step in reply.steps or [] for hits in step.docs for d in hits]]
    start = time.perf_counter()
    (completion,) = await llm.chat(
        recipe.messages(question, docs=docs), stop=list(recipe.stop),
        max_tokens=settings.generator_max_tokens, temperature=settings.temperature, top_p=settings.top_p,
        seed=settings.seed,
    )  # fmt: skip
    return recipe.parse(completion.text).answer, time.perf_counter() - start


async def _answer_all(
    url: str,
    questions: Sequence[Question],
    recipe: str,
    collection: str,
    concurrency: int,
    timeout_s: float,
    settings: AnswerSettings,
    on_answer: AnswerHook | None = None,
) -> list[dict[str, Any]]:
    client = AsyncPolicyClient(url, timeout=timeout_s)
    llm = LLMClient(f"{url.rstrip('/')}/v1", "", timeout=timeout_s)  # the chat route serves its one model
    semaphore = asyncio.Semaphore(concurrency)

    async def one(question: Question) -> dict[str, Any]:
        async with semaphore:
            start = time.perf_counter()
            try:
                fields = settings.fields(question)
                reply = await client.answer(
                    question.question, recipe, collection, return_trace=True, **fields
                )
                generated = None
                if settings.generator:
                    llm.model = reply.model
                    generated = await generate_answer(llm, question, reply, settings)
                row = _score(question, reply, None, time.perf_counter() - start, generated)
            except (ServiceError, httpx.TransportError, openai.APIError) as exc:  # a failed question
                row = _score(question, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
            bar.advance(task)
            if on_answer is not None:
                on_answer(row)
            return row

    with progress() as bar:
        task = bar.add_task(f"answering ({recipe})", total=len(questions))
        try:
            return list(await asyncio.gather(*(one(q) for q in questions)))
        finally:
            await client.aclose()
            await llm.aclose()


async def _answer_batches(
    url: str,
    questions: Sequence[Question],
    recipe: str,
    collection: str,
    batch_size: int,
    timeout_s: float,
    max_steps: int | None = None,
    shape: EpisodeShape | None = None,
    on_answer: AnswerHook | None = None,
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
                                                      max_steps=max_steps, shape=shape,
                                                      return_trace=True)  # fmt: skip
                    rows += [
                        _score(q, a, None, a.timings.total_s)
                        for q, a in zip(chunk, batch.answers, strict=True)
                    ]
                except (ServiceError, httpx.TransportError) as exc:  # failed questions, not a failed run
                    rows += [_score(q, None, f"{type(exc).__name__}: {exc}", 0.0) for q in chunk]
                bar.advance(task, len(chunk))
                if on_answer is not None:
                    for row in rows[-len(chunk) :]:
                        on_answer(row)
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
    (R2AG's T_r / T_g). ``steps``: the mean steps per episode (EVO-RAG's Avg. Steps).
    """
    latency = np.array([r["latency_s"] for r in rows]) if rows else np.zeros(1)

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows])) if rows else 0.0

    return {
        "questions": len(rows),
        "em": mean("em"),
        "f1": mean("f1"),
        "retrieval_count": mean("retrievals"),
        "steps": mean("steps"),
        "latency_p50_s": float(np.percentile(latency, 50)),
        "latency_p99_s": float(np.percentile(latency, 99)),
        "retrieval_s": mean("retrieval_s"),
        "generation_s": mean("generation_s"),
        "errors": sum(r["error"] is not None for r in rows),
        "ended": float(np.mean([r["outcome"] in ENDINGS for r in rows])) if rows else 0.0,
        "constrained": mean("constrained"),
        "outcomes": dict(Counter(r["outcome"] for r in rows)),
        **episodes_ran(rows),
        **agent_retrieval([r["retrieved"] for r in rows], [set(r["gold"]) for r in rows]),
    }


def episodes_ran(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The episode shape the service ran the answers in (``episode``: one shape, or ``None`` when
    no answer came back or the answers ran in several) and every limit it lowered (``limited``)."""
    shapes = {json.dumps(r["shape"], sort_keys=True) for r in rows if r.get("shape")}
    limited = sorted({x for r in rows for x in r.get("limited", [])})
    return {"episode": json.loads(shapes.pop()) if len(shapes) == 1 else None, "limited": limited}


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
    settings: AnswerSettings | None = None,
    corpus: bool = False,
    on_answer: AnswerHook | None = None,
) -> dict[str, Any]:
    """EM / F1 / retrieval count / latency of ``recipe`` answering ``questions[:limit]``.

    Args:
        policy_url: the policy service's base URL; its POLICY_RETRIEVER_URL must be ``retriever_url``
            (``hoprl eval-answers``, given no URLs, starts both in-process).
        collection: the retriever collection; ``None`` = index the pooled paragraphs of all
            ``questions`` (the benchmark's corpus; cached by content, see ``corpus_collection``).
        corpus: ``collection`` is a corpus (``hoprl ingest-corpus``, a Wikipedia dump) with its own
            passage ids, the open-domain setting: the agent's retrieval is scored against the gold
            paragraphs found in it by title and text (:func:`in_corpus`); ``gold_unmatched`` in
            the summary counts those it does not hold.
        concurrency: questions in flight at once (the policy batches concurrent generations).
        timeout_s: how long the client waits for one answer. The service bounds each request by its
            own POLICY_REQUEST_TIMEOUT_S (a 504, counted as an error); this only has to be longer,
            since a loaded CPU can queue a question behind many others.
        repeatable: answer through ``/v1/answer/batch`` in lock-step rounds (greedy, the same
            answers on every run against the same checkpoint and index), ``batch_size`` questions a
            request (at most the policy's POLICY_MAX_ROLLOUTS; each request must also finish within
            its POLICY_REQUEST_TIMEOUT_S); ``concurrency`` is then unused.
        settings: the request's other fields and the generation step (an evaluation protocol's,
            :meth:`AnswerSettings.of`); default: greedy, the service's step default, no generation.
            ``repeatable`` serves only greedy settings without references or a generation step.
        on_answer: called with each question's row as it is scored (a flow's progress lines:
            :class:`flows.progress.AnswerProgress`; the terminal's bar is drawn either way).

    Returns the summary (``em``, ``f1``, ``retrieval_count``, ``latency_p50_s``, ...) with
    ``recipe``, ``collection``, ``seconds`` and per-question ``predictions``.
    """
    settings = settings or AnswerSettings()
    if repeatable and not settings.greedy:
        raise ValueError(
            "repeatable answers are greedy lock-step rounds without references or a generation step; "
            f"these settings ask for {settings}: drop --repeatable"
        )
    if corpus and not collection:
        raise ValueError("corpus=True scores against a corpus collection: name it (collection=...)")
    collection = collection or prepare_collection(retriever_url, questions)
    sample = list(questions[:limit] if limit else questions)
    start = time.perf_counter()
    if repeatable:
        rows = asyncio.run(
            _answer_batches(
                policy_url,
                sample,
                recipe,
                collection,
                batch_size,
                timeout_s,
                settings.max_steps,
                settings.shape,
                on_answer,
            )
        )
    else:
        rows = asyncio.run(
            _answer_all(policy_url, sample, recipe, collection, concurrency, timeout_s, settings, on_answer)
        )
    seconds = time.perf_counter() - start
    if corpus:
        in_corpus(retriever_url, collection, sample, rows)
    return {
        "recipe": recipe,
        "collection": collection,
        "corpus": corpus,
        **({"gold_unmatched": sum(r["gold_unmatched"] for r in rows)} if corpus else {}),
        "repeatable": repeatable,
        "settings": settings.as_json(),
        **summarize(rows),
        "seconds": seconds,
        "predictions": rows,
    }
