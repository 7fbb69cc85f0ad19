"""``hoprl ingest-corpus`` run as a user runs it: a subprocess on a FlashRAG JSONL file written here.

The resumability test kills the command with SIGKILL (its whole process group: the flow, the
embedded retriever it started, the embedding) once the collection's progress record shows a batch
drawn at random with a fixed seed, then runs it again: the collection must hold exactly the file's
passages, each once, and the second run must have sent only what the first had not stored. The
fan-out test sends the batches through the real Redis to a real ``celery worker``.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import qdrant_edge as qe
import redis
from prefect.settings import PREFECT_API_URL
from prefect.testing.utilities import prefect_test_harness

from hoprl.data.corpus import pool
from hoprl.data.synthetic import generate
from hoprl.schemas import Document
from hoprl.schemas.retriever import SearchRequest
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.index import HybridIndex
from services.retriever.settings import RetrieverSettings
from tests.flows.test_fanout import REDIS_URL, worker

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
N, SIZE = 240, 8  # 30 batches
SEED = 20261128


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[str]:
    """A throwaway Prefect API the subprocesses report to (no ephemeral server each)."""
    with prefect_test_harness(server_startup_timeout=120):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="module")
def passages() -> list[Document]:
    return pool(generate(seed=0)["train"])[:N]


def write_flashrag(path: Path, documents: list[Document]) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for d in documents:
            f.write(json.dumps({"id": d.id, "contents": f'"{d.title}"\n{d.text}'}) + "\n")
    return path


def environment(api: str, **extra: str) -> dict[str, str]:
    drop = ("HOPRL_RETRIEVER_URL", "HOPRL_CELERY_BROKER_URL", "HOPRL_CELERY_EAGER", "RETRIEVER_", "QDRANT_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return env | {"PREFECT_API_URL": api, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def ingest(path: Path, collection: str, *options: str) -> list[str]:
    return [str(BIN / "hoprl"), "ingest-corpus", str(path), "--collection", collection,
            "--batch-size", str(SIZE), "--window", "2", "--json", *options]  # fmt: skip


def stored_batches(storage: Path, collection: str) -> int:
    """The progress record's ``next_batch``, read from the collection's meta.json (replaced by a
    rename, so a read sees the old record or the new one)."""
    try:
        meta = json.loads((storage / collection / "meta.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return max([int(s["next_batch"]) for s in meta.get("ingests", {}).values()], default=0)


def summary_of(out: str) -> dict[str, Any]:
    return dict(json.loads(out.strip().splitlines()[-1]))


def doc_ids(storage: Path, collection: str) -> list[str]:
    """Every point's doc id, read from the shard itself."""
    shard = qe.EdgeShard.load(str(storage / collection / "shard"))
    try:
        records, _ = shard.scroll(qe.ScrollRequest(limit=10 * N, with_payload=["doc_id"], with_vector=False))
        return [str(r.payload["doc_id"]) for r in records if r.payload]
    finally:
        shard.close()


def test_killed_at_a_random_batch_the_command_resumes_and_stores_each_passage_once(
    tmp_path: Path, prefect_api: str, passages: list[Document]
) -> None:
    path, storage, collection = write_flashrag(tmp_path / "wiki.jsonl", passages), tmp_path / "qdrant", "wiki"
    batches = N // SIZE
    kill_at = random.Random(SEED).randint(3, batches - 4)
    argv = ingest(path, collection, "--storage", str(storage), "--quantization", "int8")
    log = (tmp_path / "first.log").open("wb")
    first = subprocess.Popen(argv, env=environment(prefect_api), cwd=tmp_path, stdout=log, stderr=log,
                             start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while stored_batches(storage, collection) < kill_at:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no progress record within 300 s"
            time.sleep(0.005)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert first.returncode == -signal.SIGKILL
    before = stored_batches(storage, collection)
    assert kill_at <= before < batches

    again = subprocess.run(argv, env=environment(prefect_api), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    summary = summary_of(again.stdout)
    assert (summary["passages"], summary["batches"], summary["points"]) == (N, batches, N)
    assert summary["resumed_batches"] == before  # the stored batches were skipped, not sent again
    assert summary["sent_batches"] == batches - before
    assert summary["options"]["quantization"] == "int8"

    ids = doc_ids(storage, collection)
    assert len(ids) == N and set(ids) == {d.id for d in passages}  # every passage, each once
    index = HybridIndex(RetrieverSettings(storage_path=storage))
    try:
        target = passages[N // 2]
        response = index.search(
            SearchRequest(collection=collection, queries=[f"{target.title}. {target.text}"])
        )
        assert response.results[0][0].id == target.id
        assert index.info(collection).ingests[summary["source"]].next_batch == batches
    finally:
        index.close()


def test_another_batch_size_for_a_started_file_is_refused(
    tmp_path: Path, prefect_api: str, passages: list[Document]
) -> None:
    path, storage = write_flashrag(tmp_path / "wiki.jsonl", passages[:20]), tmp_path / "qdrant"
    env = environment(prefect_api)
    argv = ingest(path, "c", "--storage", str(storage))
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    refused = subprocess.run(
        [*argv, "--batch-size", "5"], env=env, capture_output=True, text=True, timeout=600
    )
    assert refused.returncode == 2
    assert "runs in batches of 8; resume it with --batch-size 8" in " ".join(refused.stderr.split())


@pytest.mark.integration
def test_batches_fan_out_to_a_celery_worker(
    tmp_path: Path, prefect_api: str, passages: list[Document]
) -> None:
    """With HOPRL_CELERY_BROKER_URL set, the units go through Redis to a real worker, which sends
    them to the retriever the command names."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc})")
    token = secrets.token_hex(4)
    queue, collection = f"hoprl-test-corpus-{token}", f"celery-{token}"
    path = write_flashrag(tmp_path / "wiki.jsonl", passages[:64])
    settings = RetrieverSettings(storage_path=tmp_path / "qdrant")
    with (
        LocalServer(create_app(settings)) as retriever,
        worker(
            f"corpus-{token}",
            queue,
            f"sqlite:///{tmp_path / 'registry.db'}",
            tmp_path / "worker.log",
            "solo",
            600,
        ),
    ):
        env = environment(prefect_api, HOPRL_CELERY_BROKER_URL=REDIS_URL)
        argv = [*ingest(path, collection, "--url", retriever.url, "--queue", queue), "--window", "4"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    r = redis.Redis.from_url(REDIS_URL)
    for key in r.scan_iter("celery-task-meta-*"):  # this test's results only
        if collection.encode() in (r.get(key) or b""):
            r.delete(key)
    r.delete(queue)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(done.stdout)
    assert (summary["passages"], summary["sent_batches"], summary["points"]) == (64, 8, 64)
    worker_log = (tmp_path / "worker.log").read_text()
    assert worker_log.count("Task hoprl.embed_batch") >= 8 and "succeeded" in worker_log
