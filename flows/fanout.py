"""Celery fan-out of the many small idempotent units: one episode rollout, one judge call, one
embedding batch. Prefect owns orchestration and the retries of flows; Celery owns only fan-out.

Every unit is keyed by (run id, item id) and safe to run twice, because Redis delivers *at least*
once: with ``task_acks_late`` a message is acknowledged only after its unit finished, so a worker
killed mid-unit (machine lost, OOM, SIGKILL) leaves it unacknowledged and Redis hands it to another
worker once the visibility timeout has passed; ``task_reject_on_worker_lost`` requeues at once when
only a prefork child dies. The second run writes nothing new:

- :func:`rollout_episode` stores its episode with the registry's ``ON CONFLICT DO NOTHING`` on
  (run, step, question, sample) and returns a small summary, never the trajectory;
- :func:`judge_item` caches its verdict under ``hoprl:judge-unit:<run>:<item>`` (``SET NX``, so
  a redelivered call returns the first verdict);
- :func:`embed_batch` ingests through the retriever, which upserts by document id.

Configuration (environment, :class:`hoprl.settings.HoprlSettings`, read when Celery first needs its
configuration: a worker as it starts, the flow's process at its first fan-out; the flow's process
and every worker must agree):

- ``HOPRL_CELERY_BROKER_URL``: broker *and* result backend (default ``redis://127.0.0.1:6379/1``);
- ``HOPRL_FANOUT_TIMEOUT``: seconds :func:`fan_out` waits for a group before it gives up (default
  3600). The broker's **visibility timeout** (seconds before an unacknowledged unit is handed to
  another worker) is derived from it: a quarter of it (900 s by default), so a unit whose worker
  was lost is redelivered, and has three quarters of the wait left to run again, before the
  fan-out gives up. (A visibility timeout longer than the wait would let the fan-out give up on a
  unit that was never redelivered.) The visibility timeout must also exceed the longest unit, or a
  slow unit still running is handed out a second time (harmless for these units, wasted work):
  raise ``HOPRL_FANOUT_TIMEOUT`` for slower units;
- ``HOPRL_CELERY_EAGER=1``: run units in the calling process (tests, ``make run`` without Redis);
  :func:`use_eager` switches it at run time.

Start workers with ``celery -A flows.fanout worker`` (as docker compose does), then::

    units = [
        rollout_episode.s("r1", 0, q.model_dump(), 0, "search-r1", "wiki", policy_url, retriever_url,
                          {"max_steps": 4})
        for q in questions
    ]
    summaries = fan_out(units)  # one dict per unit, in order; waits up to HOPRL_FANOUT_TIMEOUT
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx
import openai
import redis
from celery import Celery, group
from celery.canvas import Signature
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from hoprl.agent.runner import run_episode
from hoprl.clients.http import ServiceError
from hoprl.clients.judge import JudgeClient
from hoprl.clients.llm import LLMClient
from hoprl.clients.policy import PolicyClient
from hoprl.clients.retriever import AsyncRetrieverClient, RetrieverClient
from hoprl.data.jsonl import DataError
from hoprl.domain import Episode, EpisodeShape, Question
from hoprl.recipes import get_recipe
from hoprl.registry import total_reward
from hoprl.registry.shared import from_environment
from hoprl.schemas import Document
from hoprl.schemas.judge import AnswerableItem, AnswerItem
from hoprl.schemas.retriever import IngestCheckpoint
from hoprl.settings import get_settings

log = logging.getLogger(__name__)

JUDGE_CACHE_TTL_S = 30 * 24 * 3600
# Transient I/O failures worth another attempt; anything else (a 4xx, a bug) fails the unit at once.
IO_ERRORS = (httpx.TransportError, openai.APIConnectionError, redis.ConnectionError, redis.TimeoutError)


def _restore_options(visibility_timeout: int) -> dict[str, int]:
    """How often a worker looks for abandoned units: about every tenth of the visibility timeout,
    between 1 s and kombu's default of 100 s (10 s interval x every 10th sweep)."""
    period = max(1, min(100, visibility_timeout // 10))
    interval = min(10, period)
    return {"unacked_restore_interval": interval, "unacked_restore_throttle": max(1, period // interval)}


def visibility_timeout_s(fanout_timeout_s: float) -> int:
    """A quarter of the fan-out's wait (see the module docstring)."""
    return max(1, int(fanout_timeout_s / 4))


def environment_config() -> dict[str, Any]:
    """The Celery settings the ``HOPRL_*`` variables decide (broker, eager, timeouts)."""
    config = get_settings()
    visibility = visibility_timeout_s(config.fanout_timeout)
    return {
        "broker_url": config.broker_url,
        "result_backend": config.broker_url,
        "task_always_eager": config.celery_eager,
        "broker_transport_options": {"visibility_timeout": visibility, **_restore_options(visibility)},
        "result_backend_transport_options": {"visibility_timeout": visibility},
    }


app = Celery("hoprl")
# Read when the configuration is first needed, not at import; app.conf and use_eager override it.
app.add_defaults(environment_config)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    task_eager_propagates=True,
    broker_connection_retry_on_startup=True,
    result_expires=7 * 24 * 3600,
    worker_hijack_root_logger=False,
)

# Bounded retries with exponential backoff (1 s, 2 s, 4 s, jittered), only on I/O errors.
UNIT = {"autoretry_for": IO_ERRORS, "max_retries": 3, "retry_backoff": True, "retry_backoff_max": 60}


def use_eager(eager: bool = True) -> None:
    """Run units in the calling process (no broker, no result backend) or go back to the broker."""
    app.conf.task_always_eager = eager


# -- rollouts -----------------------------------------------------------------------------------


#: the registry at ``$HOPRL_DATABASE_URL`` as it is now, one open per worker process and URL (a
#: cache keyed on the first URL once wrote a unit into another test's database)
registry = functools.partial(from_environment, "flows")


@functools.cache
def served_model(policy_url: str) -> str:
    """The model id a policy service serves (``GET /v1/models``), when the caller names none."""
    with PolicyClient(policy_url, timeout=30) as policy:  # sends $HOPRL_API_KEY
        return policy.model()


def score(recipe: Any, episode: Episode, question: Question) -> dict[str, float]:
    """Every reward signal of ``recipe`` on one episode, as ``{name@version: value}``.

    ``None`` ("not applicable") signals are left out; the registry sums the rest.
    """
    columns = {
        "answers": [list(question.answers)],
        "gold_titles": [list(question.gold_titles)],
        "paragraphs": [[p.model_dump() for p in question.paragraphs]],
    }
    completion = "".join(s.text for s in episode.steps)
    rewards = {}
    for fn in recipe.reward_funcs():
        name = getattr(fn, "__version__", getattr(fn, "__name__", "reward"))
        (value,) = fn(prompts=[episode.question], completions=[completion], episodes=[episode], **columns)
        if value is not None:
            rewards[name] = float(value)
    return rewards


async def _run(
    recipe: Any, question: Question, sample: int, collection: str, llm: LLMClient, retriever_url: str,
    options: dict[str, Any],
) -> Episode:  # fmt: skip
    retriever = AsyncRetrieverClient(retriever_url)
    try:
        return await run_episode(recipe, question, llm, retriever, collection, sample=sample, **options)
    finally:
        await llm.aclose()
        await retriever.aclose()


@app.task(name="hoprl.rollout_episode", **UNIT)
def rollout_episode(
    run_id: str,
    step: int,
    question: dict[str, Any],
    sample: int,
    recipe: str,
    collection: str,
    policy_url: str,
    retriever_url: str,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one episode, score it and store it in the run's registry; unit key (step, question, sample).

    Args:
        question: a :class:`hoprl.schemas.Question` as JSON (``q.model_dump()``).
        policy_url: the policy service's root (``http://policy:8002``); ``/v1`` is its OpenAI API.
        options: :class:`hoprl.agent.runner.RunOptions` fields (``shape`` as JSON), plus ``model``
            (default: the one the service serves), ``recipe_config`` (keyword arguments of
            ``get_recipe``, e.g. the curriculum stage) and ``request_timeout_s`` (per model call,
            default 300).

    Returns a summary (ids, outcome, reward, retrieval count, ``written``: whether this delivery
    stored the episode); the trajectory itself is in the registry.
    """
    opts = dict(options or {})
    model = opts.pop("model", None) or served_model(policy_url)
    agent = get_recipe(recipe, **opts.pop("recipe_config", {}))
    llm = LLMClient(f"{policy_url.rstrip('/')}/v1", model=model, timeout=opts.pop("request_timeout_s", 300))
    q = Question.model_validate(question)
    opts["shape"] = EpisodeShape.model_validate(opts["shape"])
    episode = asyncio.run(_run(agent, q, sample, collection, llm, retriever_url, opts))
    rewards = score(agent, episode, q)
    written = registry().write_episodes(run_id, step, [episode], [rewards])
    log.info("run %s step %d: %s sample %d -> %s (new rows: %d)", run_id, step, q.id, sample,
             episode.outcome, written)  # fmt: skip
    return {
        "run_id": run_id,
        "step": step,
        "question_id": q.id,
        "sample": sample,
        "outcome": episode.outcome,
        "reward": total_reward(rewards),
        "rewards": rewards,
        "retrieval_count": episode.retrieval_count,
        "written": written == 1,
    }


# -- judge calls --------------------------------------------------------------------------------


class VerdictStore(Protocol):
    def get(self, key: str) -> Any: ...

    def set(self, key: str, value: str, *, nx: bool, ex: int) -> Any: ...


class MemoryStore:
    """The eager-mode verdict cache: a dict with Redis's ``get`` / ``set(nx=...)`` (no expiry)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def set(self, key: str, value: str, *, nx: bool, ex: int) -> bool:
        if nx and key in self.data:
            return False
        self.data[key] = value
        return True


_memory = MemoryStore()


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def verdict_store() -> VerdictStore:
    """The result backend's Redis, or an in-process dict when units run eagerly."""
    if app.conf.task_always_eager:
        return _memory
    return _redis(app.conf.result_backend)


def judge_key(run_id: str, item_id: str) -> str:
    return f"hoprl:judge-unit:{run_id}:{item_id}"


@app.task(name="hoprl.judge_item", **UNIT)
def judge_item(
    run_id: str, item_id: str, kind: str, payload: dict[str, Any], judge_url: str
) -> dict[str, Any]:
    """One judge call (``kind`` "answer" or "answerable"), its verdict cached under (run, item).

    Args:
        payload: an :class:`~hoprl.schemas.judge.AnswerItem` or
            :class:`~hoprl.schemas.judge.AnswerableItem` as JSON.

    Returns the verdict's fields plus ``run_id``, ``item_id``, ``kind`` and ``unit_cached`` (the
    verdict was stored by an earlier delivery of this unit; no judge call was made).
    """
    if kind not in ("answer", "answerable"):
        raise ValueError(f"unknown judge kind {kind!r}; valid: answer, answerable")
    store, key = verdict_store(), judge_key(run_id, item_id)
    head = {"run_id": run_id, "item_id": item_id, "kind": kind}
    cached = store.get(key)
    if cached is not None:
        return {**head, **json.loads(cached), "unit_cached": True}
    with JudgeClient(judge_url) as client:
        if kind == "answer":
            (verdict,) = client.answer([AnswerItem.model_validate(payload)])
        else:
            (verdict,) = client.answerable([AnswerableItem.model_validate(payload)])
    # NX: when two deliveries race, both return the verdict stored first.
    store.set(key, verdict.model_dump_json(), nx=True, ex=JUDGE_CACHE_TTL_S)
    return {**head, **json.loads(store.get(key) or verdict.model_dump_json()), "unit_cached": False}


# -- embedding batches --------------------------------------------------------------------------


@app.task(name="hoprl.embed_batch", **UNIT)
def embed_batch(
    run_id: str,
    batch_id: str,
    collection: str,
    documents: list[dict[str, Any]],
    retriever_url: str,
    checkpoint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Embed and upsert one batch of documents into ``collection`` (idempotent by document id).

    Args:
        checkpoint: an :class:`~hoprl.schemas.retriever.IngestCheckpoint` as JSON, when the batch is
            part of a source file (``flows/corpus.py``): the retriever records it in the
            collection's progress once the batch is stored. A batch the retriever refuses (a
            document id repeated within the file) raises :class:`~hoprl.data.jsonl.DataError`.
    """
    docs = [Document.model_validate(d) for d in documents]
    mark = IngestCheckpoint.model_validate(checkpoint) if checkpoint is not None else None
    with RetrieverClient(retriever_url, timeout=600) as client:
        try:
            result = client.ingest(collection, docs, mark)
        except ServiceError as exc:
            if exc.status != 409:
                raise
            raise DataError(
                exc.body.get("message", str(exc)) if isinstance(exc.body, dict) else str(exc)
            ) from None
    return {
        "run_id": run_id,
        "batch_id": batch_id,
        "collection": collection,
        "upserted": result.upserted,
        "points": result.points,
    }


# -- fan-out ------------------------------------------------------------------------------------


def fan_out(
    units: Sequence[Signature],
    timeout: float | None = None,
    queue: str | None = None,
    description: str = "fan-out",
    poll_s: float = 0.5,
    threads: int = 1,
) -> list[Any]:
    """Submit ``units`` as one group, show a progress bar, and return their results in order.

    Args:
        units: task signatures, e.g. ``rollout_episode.s(...)``.
        timeout: seconds to wait for all of them (default ``HOPRL_FANOUT_TIMEOUT``, from which the
            visibility timeout is derived; a shorter one may give up before a lost unit comes
            back); on expiry raises ``TimeoutError`` (the units keep running on the workers, and
            their writes stay idempotent).
        queue: route every unit to this queue (workers started with ``-Q``).
        threads: without a broker (eager), run the units in this many threads: eagerly a group runs
            its units one after another, so the services they call never see two at once (the
            headroom's 48 sampled episodes took about 5 minutes while the policy, which batches
            concurrent episodes, decoded one at a time). Units that must not overlap keep 1.

    A failed unit (after its retries) raises its error here.
    """
    if not units:
        return []
    if app.conf.task_always_eager and threads > 1:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda unit: unit.apply().get(), units))
    # Fresh copies: a signature listed twice must still be two messages with two task ids.
    units = [u.clone(queue=queue) if queue else u.clone() for u in units]
    timeout = get_settings().fanout_timeout if timeout is None else timeout
    result = group(units).apply_async()
    deadline = time.monotonic() + timeout
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = Console(stderr=True)  # beside the flow's log lines; no bar where stderr is not a terminal
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task(description, total=len(units))
        while not result.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{description}: {result.completed_count()} of {len(units)} units done after "
                    f"{timeout:.0f} s; raise HOPRL_FANOUT_TIMEOUT or add workers "
                    "(celery -A flows.fanout worker)"
                )
            progress.update(bar, completed=result.completed_count())
            time.sleep(poll_s)
        progress.update(bar, completed=len(units))
    # Each result is ready; reading them one by one also works for eager results (no backend).
    return [r.get(timeout=max(1.0, deadline - time.monotonic())) for r in result.results or []]
