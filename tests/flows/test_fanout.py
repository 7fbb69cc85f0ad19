"""Celery fan-out: every unit eagerly against live services, then through the real Redis with real
``celery worker`` processes, including a worker (and a prefork child) killed mid-unit.

Services run in this process over real HTTP on 127.0.0.1: the retriever (embedded Qdrant), a rules
judge and a scripted OpenAI-compatible policy whose requests can be held at a gate (so a unit is
provably mid-flight when its worker is killed). The registry is a fresh PostgreSQL database when a
server answers on 127.0.0.1:5432, else a SQLite file; workers write to it from their own processes.
The broker tests use Redis db 15 with a queue unique to the test run and delete their keys after.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.canvas import Signature
from celery.signals import after_task_publish
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from flows import fanout
from flows.fanout import embed_batch, fan_out, judge_item, rollout_episode
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.synthetic import SyntheticQuestion, generate, hops_for
from hoprl.recipes import get_recipe
from hoprl.registry import Registry, shared
from hoprl.schemas import Document
from hoprl.settings import get_settings
from services.judge.app import create_app as create_judge
from services.judge.settings import JudgeSettings
from services.local import LocalServer
from tests import scripted_llm as scripted

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/15"  # this file's own database number
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RECIPE = "search-r1"
OPTIONS = {
    "model": "scripted",
    "seed": 5,
    "shape": {"max_steps": 8, "max_new_tokens_per_step": 512, "token_budget": 4096, "temperature": 0.7},
}


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


# -- services and registry ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def questions(retriever_url: str) -> tuple[str, list[SyntheticQuestion]]:
    """A fresh collection holding the paragraphs of a 2-hop and a 4-hop question."""
    pool = generate(seed=3, n_entities=80, n_train=12, n_dev=0, n_test=0)["train"]
    chosen = [pool[5], pool[6]]
    collection = f"fanout-{secrets.token_hex(4)}"
    docs = {
        hashlib.sha1(f"{p.title}\n{p.text}".encode()).hexdigest()[:16]: p for q in pool for p in q.paragraphs
    }
    with RetrieverClient(retriever_url) as client:
        client.ingest(collection, [Document(id=i, title=p.title, text=p.text) for i, p in docs.items()])
    return collection, chosen


@pytest.fixture(scope="module")
def policy(questions: tuple[str, list[SyntheticQuestion]]) -> Iterator[tuple[str, Any]]:
    """(root URL, app) of a scripted policy replaying the search-r1 expert.

    While ``app.state.hold`` is set, requests wait at the gate; ``app.state.arrived`` counts them.
    """
    recipe = get_recipe(RECIPE)
    app = scripted.create_app({q.question: recipe.expert_segments(q) for q in questions[1]})
    app.state.hold = threading.Event()
    app.state.arrived = 0

    @app.middleware("http")
    async def gate(request: Any, call_next: Any) -> Any:
        app.state.arrived += 1
        while app.state.hold.is_set():
            await asyncio.sleep(0.05)
        return await call_next(request)

    with LocalServer(app) as server:
        yield server.url, app


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    with LocalServer(create_judge(JudgeSettings(backend="rules"))) as server:
        yield server.url


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh PostgreSQL database (dropped after), or a SQLite file where no server answers."""
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    name = f"hoprl_fanout_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception:  # no server: the zero-setup SQLite registry, which also takes several writers
        admin.dispose()
        yield f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}"
        return
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        shared.forget()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def run_id(registry_url: str) -> Iterator[str]:
    """A new run in the registry, as the flows create it before fanning out."""
    rid = f"fanout-{uuid.uuid4().hex[:10]}"
    with Registry(registry_url) as reg:
        reg.create_run(rid, recipe=RECIPE, objective="grpo", model="scripted", config={}, seed=0)
    yield rid


def count(registry_url: str, run_id: str) -> int:
    with Registry(registry_url) as reg:
        return reg.count_episodes(run_id)


def rollouts(
    make: Callable[..., Signature], run_id: str, questions: tuple[str, list[SyntheticQuestion]],
    policy_url: str, retriever_url: str, samples: tuple[int, ...] = (0, 1),
) -> list[Signature]:  # fmt: skip
    collection, qs = questions
    return [
        make(run_id, 0, q.model_dump(mode="json"), s, RECIPE, collection, policy_url, retriever_url, OPTIONS)
        for q in qs
        for s in samples
    ]


# -- (a) eager units ------------------------------------------------------------------------------


@pytest.fixture
def eager(registry_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("HOPRL_DATABASE_URL", registry_url)
    shared.forget()
    was_eager = fanout.app.conf.task_always_eager
    fanout.use_eager()
    yield
    fanout.use_eager(was_eager)
    shared.forget()


@pytest.mark.usefixtures("eager")
def test_eager_rollouts_are_written_once(
    questions: tuple[str, list[SyntheticQuestion]], policy: tuple[str, Any], retriever_url: str,
    registry_url: str, run_id: str,
) -> None:  # fmt: skip
    units = rollouts(rollout_episode.s, run_id, questions, policy[0], retriever_url)
    first = fan_out(units, timeout=60)
    assert [(s["question_id"], s["sample"]) for s in first] == [
        (q.id, s) for q in questions[1] for s in (0, 1)
    ]
    hops = {q.id: len(hops_for(q)) for q in questions[1]}
    for summary in first:
        assert summary["outcome"] == "answer" and summary["written"] is True
        assert summary["reward"] == pytest.approx(1.0)  # search-r1's EM on the expert's answer
        assert summary["retrieval_count"] == hops[summary["question_id"]]  # one query per hop
        assert "steps" not in summary and "trajectory" not in summary  # the registry holds those
    again = fan_out(units[:2], timeout=60)  # a replayed step (or a redelivered unit)
    assert [s["written"] for s in again] == [False, False]
    assert count(registry_url, run_id) == 4
    with Registry(registry_url) as reg:
        rows = reg.episodes(run_id)
    assert {(r.question_id, r.sample) for r in rows} == {(q.id, s) for q in questions[1] for s in (0, 1)}
    assert all(r.total_reward == pytest.approx(1.0) and r.trajectory["steps"] for r in rows)


@pytest.mark.usefixtures("eager")
def test_eager_rollouts_in_threads_come_back_in_order_and_written_once(
    questions: tuple[str, list[SyntheticQuestion]], policy: tuple[str, Any], retriever_url: str,
    registry_url: str, run_id: str,
) -> None:  # fmt: skip
    """``threads`` (the local pipeline's rollouts): the units run side by side, each result in its
    unit's place, each episode stored once; a failed unit raises as it does one at a time."""
    units = rollouts(rollout_episode.s, run_id, questions, policy[0], retriever_url)
    first = fan_out(units, timeout=60, threads=4)
    assert [(s["question_id"], s["sample"]) for s in first] == [
        (q.id, s) for q in questions[1] for s in (0, 1)
    ]
    assert all(s["written"] is True and s["reward"] == pytest.approx(1.0) for s in first)
    assert [s["written"] for s in fan_out(units, timeout=60, threads=4)] == [False] * len(units)
    assert count(registry_url, run_id) == len(units)
    broken = rollout_episode.s(run_id, 0, {"id": "x"}, 0, RECIPE, "c", policy[0], retriever_url, OPTIONS)
    with pytest.raises(ValidationError):  # a question without its fields
        fan_out([units[0], broken], timeout=60, threads=2)


@pytest.mark.usefixtures("eager")
def test_eager_judge_items_are_cached_by_key(judge_url: str, run_id: str) -> None:
    answer = {"question": "Capital of France?", "prediction": "paris", "references": ["Paris"]}
    wrong = {"question": "Capital of France?", "prediction": "Lyon", "references": ["Paris"]}
    answerable = {"question": "Who founded Acme?", "evidence": ["Acme was founded by Ada Roe."],
                  "references": ["Ada Roe"]}  # fmt: skip
    units = [
        judge_item.s(run_id, "q1", "answer", answer, judge_url),
        judge_item.s(run_id, "q2", "answer", wrong, judge_url),
        judge_item.s(run_id, "q3", "answerable", answerable, judge_url),
        judge_item.s(run_id, "q1", "answer", answer, judge_url),  # the same unit, delivered again
    ]
    out = fan_out(units, timeout=60)
    assert [r["verdict"] for r in out] == [True, False, True, True]
    assert [r["unit_cached"] for r in out] == [False, False, False, True]
    assert out[3]["rationale"] == out[0]["rationale"] and out[0]["version"] == "rules@3"
    with pytest.raises(ValueError, match="valid: answer, answerable"):
        judge_item.s(run_id, "q4", "grade", answer, judge_url).apply().get()


@pytest.mark.usefixtures("eager")
def test_eager_embed_batches_are_idempotent(retriever_url: str, run_id: str) -> None:
    collection = f"fanout-embed-{secrets.token_hex(4)}"
    docs = [{"id": f"d{i}", "title": f"Title {i}", "text": f"Paragraph number {i} about topic {i}."}
            for i in range(6)]  # fmt: skip
    units = [
        embed_batch.s(run_id, f"b{i}", collection, docs[3 * i : 3 * i + 3], retriever_url) for i in (0, 1)
    ]
    out = fan_out([*units, units[0]], timeout=60)
    assert [(r["batch_id"], r["upserted"]) for r in out] == [("b0", 3), ("b1", 3), ("b0", 3)]
    assert out[2]["points"] == 6  # the repeated batch replaced its points, added none
    with RetrieverClient(retriever_url) as client:
        (hits,) = client.search(collection, ["Paragraph number 4"], top_k=1)
    assert hits[0].id == "d4"


# -- (b) the real Redis and real workers -----------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator[dict[str, Any]]:
    """Redis db 15 with a queue unique to this run; deletes every key the tests made."""
    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        r.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); the broker tests need the real one")
    token = uuid.uuid4().hex[:8]  # in every queue and worker name of this run, to clean up by
    queue = f"hoprl-test-fanout-{token}"
    client = Celery("hoprl-test-client", broker=REDIS_URL, backend=REDIS_URL)
    client.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"])
    task_ids: list[str] = []

    def remember(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers and "id" in headers:
            task_ids.append(headers["id"])

    after_task_publish.connect(remember, weak=False)
    yield {"queue": queue, "token": token, "client": client, "redis": r}
    after_task_publish.disconnect(remember)
    r.delete(*r.scan_iter(match=f"*{token}*"), *(f"celery-task-meta-{i}" for i in task_ids))
    pidbox = "_kombu.binding.celery.pidbox"  # the workers' remote-control bindings
    ours = [m for m in r.smembers(pidbox) if token.encode() in m]
    if ours:
        r.srem(pidbox, *ours)
    client.close()
    r.close()


@contextmanager
def worker(
    name: str, queue: str, registry_url: str, log: Path, pool: str, fanout_timeout_s: int
) -> Iterator[Any]:
    """A real ``celery -A flows.fanout worker`` in its own process group; stopped (TERM, then KILL).

    ``fanout_timeout_s`` is ``HOPRL_FANOUT_TIMEOUT``, the one setting the worker derives its
    visibility timeout from (a quarter of it).
    """
    env = {k: v for k, v in os.environ.items() if k != "HOPRL_CELERY_EAGER"}
    env |= {
        "HOPRL_CELERY_BROKER_URL": REDIS_URL,
        "HOPRL_FANOUT_TIMEOUT": str(fanout_timeout_s),
        "HOPRL_DATABASE_URL": registry_url,
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, "-m", "celery", "-A", "flows.fanout", "worker", "-Q", queue, "-c", "1",
        "--pool", pool, "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel", "INFO",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for(
                lambda: b" ready." in log.read_bytes() or proc.poll() is not None, 120, f"{name} to start"
            )
            assert proc.poll() is None, f"worker {name} exited: {log.read_text()[-3000:]}"
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


@pytest.fixture(scope="module")
def prefork_worker(
    broker: dict[str, Any], registry_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Path]]:
    log = tmp_path_factory.mktemp("worker") / "prefork.log"
    with worker(
        f"fanout-prefork-{broker['token']}", broker["queue"], registry_url, log, "prefork", 120
    ) as proc:
        yield proc, log


@pytest.mark.integration
def test_worker_runs_every_kind_of_unit(
    broker: dict[str, Any], prefork_worker: Any, questions: tuple[str, list[SyntheticQuestion]],
    policy: tuple[str, Any], retriever_url: str, judge_url: str, registry_url: str, run_id: str,
) -> None:  # fmt: skip
    sig = broker["client"].signature
    units = rollouts(
        lambda *a: sig(rollout_episode.name, args=a), run_id, questions, policy[0], retriever_url
    )
    payload = {"prediction": "Paris", "references": ["paris"]}
    docs = [{"id": f"w{i}", "title": f"T{i}", "text": f"worker text {i}"} for i in range(3)]
    units += [
        units[0],  # a duplicate delivery of the first rollout
        sig(judge_item.name, args=(run_id, "j1", "answer", payload, judge_url)),
        sig(judge_item.name, args=(run_id, "j1", "answer", payload, judge_url)),
        sig(embed_batch.name, args=(run_id, "b0", f"fanout-w-{run_id}", docs, retriever_url)),
    ]
    try:
        out = fan_out(units, timeout=60, queue=broker["queue"])
    finally:
        verdict = broker["redis"].getdel(f"hoprl:judge-unit:{run_id}:j1")
    episodes, judged, embedded = out[:5], out[5:7], out[7]
    assert [e["outcome"] for e in episodes] == ["answer"] * 5
    assert [e["written"] for e in episodes] == [True] * 4 + [False]
    assert count(registry_url, run_id) == 4  # exactly one row per unit
    assert [(j["verdict"], j["unit_cached"]) for j in judged] == [(True, False), (True, True)]
    assert verdict is not None  # cached by (run, item) in the result backend's Redis
    assert (embedded["upserted"], embedded["points"]) == (3, 3)


@pytest.mark.integration
def test_prefork_child_killed_mid_unit_is_requeued(
    broker: dict[str, Any], prefork_worker: tuple[Any, Path], questions: tuple[str, list[SyntheticQuestion]],
    policy: tuple[str, Any], retriever_url: str, registry_url: str, run_id: str,
) -> None:  # fmt: skip
    """reject_on_worker_lost: the parent sees its child die and puts the unit back at once."""
    proc, log = prefork_worker
    url, app = policy
    sig = broker["client"].signature
    (unit,) = rollouts(lambda *a: sig(rollout_episode.name, args=a), run_id, questions, url, retriever_url,
                       samples=(0,))[:1]  # fmt: skip
    app.state.hold.set()
    arrived = app.state.arrived
    with ThreadPoolExecutor(1) as pool:
        try:
            future = pool.submit(fan_out, [unit], 60, broker["queue"])
            wait_for(lambda: app.state.arrived > arrived, 30, "the unit's first model call")
            (child,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            os.kill(int(child), signal.SIGKILL)
            assert count(registry_url, run_id) == 0
        finally:
            app.state.hold.clear()
        (summary,) = future.result(timeout=60)
    assert summary["outcome"] == "answer" and summary["written"] is True
    assert count(registry_url, run_id) == 1
    assert b"exited with 'signal 9 (SIGKILL)'" in log.read_bytes()


# The flow's side of a fan-out, as a process of its own: it reads HOPRL_FANOUT_TIMEOUT like the
# workers do and waits for the group with fan_out's default wait.
FLOW = """
import json, sys
from flows.fanout import fan_out, rollout_episode
args, queue, out = json.loads(sys.argv[1])
summaries = fan_out([rollout_episode.s(*args)], queue=queue)
open(out, "w").write(json.dumps(summaries))
"""
FANOUT_WAIT_S = 60  # HOPRL_FANOUT_TIMEOUT of this test: workers derive a 15 s visibility timeout


@pytest.mark.integration
def test_worker_killed_mid_unit_is_redone_before_the_fan_out_gives_up(
    broker: dict[str, Any], questions: tuple[str, list[SyntheticQuestion]], policy: tuple[str, Any],
    retriever_url: str, registry_url: str, run_id: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The whole worker is SIGKILLed mid-unit (machine lost). Only ``HOPRL_FANOUT_TIMEOUT`` is set,
    for the flow's process and the workers alike: the unacknowledged unit is handed to the next
    worker once the derived visibility timeout passes, is written exactly once, and the flow's
    ``fan_out`` (its default wait) gets the result before it gives up. With a visibility timeout
    longer than the wait (the old defaults: 7200 s against 3600 s) the fan-out gives up first."""
    url, app = policy
    queue = broker["queue"] + "-kill"
    collection, qs = questions
    args = [run_id, 0, qs[0].model_dump(mode="json"), 1, RECIPE, collection, url, retriever_url, OPTIONS]
    env = {k: v for k, v in os.environ.items() if k != "HOPRL_CELERY_EAGER"}
    env |= {"HOPRL_CELERY_BROKER_URL": REDIS_URL, "HOPRL_FANOUT_TIMEOUT": str(FANOUT_WAIT_S)}
    out, flow_log = tmp_path / "summaries.json", (tmp_path / "flow.log").open("wb")
    app.state.hold.set()
    arrived = app.state.arrived
    flow = None
    try:
        with worker(
            f"fanout-a-{broker['token']}", queue, registry_url, tmp_path / "a.log", "solo", FANOUT_WAIT_S
        ) as first:
            flow = subprocess.Popen(
                [sys.executable, "-c", FLOW, json.dumps([args, queue, str(out)])], cwd=ROOT, env=env,
                stdout=subprocess.DEVNULL, stderr=flow_log,
            )  # fmt: skip
            wait_for(lambda: app.state.arrived > arrived, 60, "the unit's first model call")
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
        assert count(registry_url, run_id) == 0
        app.state.hold.clear()
        with worker(
            f"fanout-b-{broker['token']}", queue, registry_url, tmp_path / "b.log", "solo", FANOUT_WAIT_S
        ):
            try:
                flow.wait(timeout=FANOUT_WAIT_S + 30)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"fan_out waited past HOPRL_FANOUT_TIMEOUT={FANOUT_WAIT_S}") from None
    finally:
        app.state.hold.clear()
        if flow is not None and flow.poll() is None:
            flow.kill()
            flow.wait()
        flow_log.close()
    assert flow.returncode == 0, (tmp_path / "flow.log").read_text()[-3000:]
    (summary,) = json.loads(out.read_text())
    assert summary["outcome"] == "answer" and summary["question_id"] == qs[0].id
    assert count(registry_url, run_id) == 1
    # The same message: received by the killed worker, finished by the next one.
    (task_id,) = re.findall(r"rollout_episode\[([0-9a-f-]+)\] received", (tmp_path / "a.log").read_text())
    assert f"rollout_episode[{task_id}] succeeded" in (tmp_path / "b.log").read_text()


def test_visibility_timeout_is_derived_from_the_fan_out_wait() -> None:
    """The two timeouts come from one setting; redelivery (visibility timeout plus one restore
    sweep) comes well before the fan-out's default wait ends."""
    options = fanout.app.conf.broker_transport_options
    sweep = options["unacked_restore_interval"] * options["unacked_restore_throttle"]
    wait = get_settings().fanout_timeout
    assert options["visibility_timeout"] == fanout.visibility_timeout_s(wait) == int(wait / 4)
    assert options["visibility_timeout"] + sweep < wait / 2
