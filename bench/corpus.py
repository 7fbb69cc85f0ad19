"""Corpus-scale benchmark: build a passage file of N passages, ingest it, size it three ways, time it.

    python bench/corpus.py --n 20000                 # about 5-10 minutes on 2 cores
    python bench/corpus.py --n 1000000 --out /big    # the Wikipedia-scale run (hours)

The corpus (a FlashRAG JSONL file, ``--out``/corpus.jsonl):

- **needles**: every paragraph of every question file in ``--data`` (the benchmark samples: all
  splits of HotpotQA, 2WikiMultiHopQA and MuSiQue), de-duplicated by (title, text) as
  :func:`hoprl.data.corpus.pool` does: 16,867 real Wikipedia paragraphs. Below that N, a seeded
  sample of them.
- **distractors**, up to N: real text re-cut. The needles' sentences are shuffled (seeded) and
  regrouped into new passages with as many sentences as a needle drawn at random, titled after
  the paragraph of their first sentence. They have the needles' vocabulary and length, so BM25 and
  the dense vectors see Wikipedia-like text, but none of them is any question's gold paragraph.

What is measured:

1. **ingest**: ``hoprl ingest-corpus``'s flow (:func:`flows.corpus.ingest_corpus`) into a collection
   ``ingested`` with the default options, through a retriever started as its own process (embedded
   qdrant-edge, the default ONNX int8 encoder at 64 tokens); passages embedded per second, and per
   core (every core of the machine encodes).
2. **size**: ``ingested`` is copied point by point (the same vectors, no second embedding) into
   three collections that differ only by their options: ``float32`` (the defaults, in RAM),
   ``int8`` (scalar quantization) and ``binary`` (binary quantization), the last two with the
   original vectors on disk and the quantized ones in RAM (``always_ram``); each is optimized
   (HNSW graph and quantized vectors built). For each: the dense vectors the layout keeps in RAM
   (computed), the shard's size on disk, and the memory a fresh process holds after loading it and
   running the queries (RssAnon: heap; RssFile: file pages mapped in, which the kernel may drop
   and read back).
3. **search**: hybrid ``/v1/search`` (dense + BM25, RRF, the feedback round; int8 and binary
   rescored with the original vectors) over HTTP with 1 and 16 concurrent clients: p50 / p99
   latency, queries per second, and Recall@5 of the questions' gold paragraphs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import qdrant_edge as qe

from flows import fanout
from flows.corpus import ingest_corpus
from flows.stack import local_process
from hoprl.data.corpus import gold_ids, pool, recut
from hoprl.data.jsonl import load_questions
from hoprl.domain import Question
from hoprl.schemas import Document
from hoprl.schemas.retriever import CollectionOptions
from services.retriever.index import load_embedder
from services.retriever.settings import RetrieverSettings
from services.retriever.sparse import Bm25
from services.retriever.store import EdgeStore

VARIANTS = {
    "float32": CollectionOptions(),
    "int8": CollectionOptions(on_disk=True, quantization="int8", always_ram=True, rescore=True),
    "binary": CollectionOptions(
        on_disk=True, quantization="binary", always_ram=True, rescore=True, oversampling=3.0
    ),
}


def build_corpus(data: Path, n: int, seed: int) -> tuple[list[Document], list[Question]]:
    """N passages (needles, then distractors; shuffled together) and the questions whose gold
    paragraphs are all in it."""
    rng = random.Random(seed)
    questions = [q for path in sorted(data.glob("*.jsonl")) for q in load_questions(path)]
    needles = pool(questions)
    if n < len(needles):
        needles = rng.sample(needles, n)
    distractors = recut(needles, n - len(needles), rng, "distractor-")
    corpus = needles + distractors
    rng.shuffle(corpus)
    ids = {d.id for d in corpus}
    answerable = [q for q in questions if gold_ids(q) and gold_ids(q) <= ids]
    return corpus, answerable


def write_flashrag(path: Path, documents: list[Document]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for d in documents:
            f.write(json.dumps({"id": d.id, "contents": f'"{d.title}"\n{d.text}'}, ensure_ascii=False) + "\n")


def copy_collection(store: EdgeStore, source: str, target: str, options: CollectionOptions) -> None:
    """``source``'s points, vectors and payloads as they are, into a new collection ``target``."""
    meta = {**store.meta(source), "options": options.model_dump(), "ingests": {}}
    store.create(target, int(meta["dim"]), meta, options)
    shard, offset = store.shards[source], None
    while True:
        records, offset = shard.scroll(
            qe.ScrollRequest(offset=offset, limit=1000, with_payload=True, with_vector=True)
        )
        points = [qe.Point(id=r.id, vector=r.vector, payload=r.payload) for r in records]  # type: ignore[arg-type]
        with store.lock:
            store.shards[target].update(qe.UpdateOperation.upsert_points(points))
        if offset is None:
            break
    store.shards[target].flush()


def vectors_in_ram_mb(n: int, dim: int, options: CollectionOptions) -> float:
    """What the layout keeps of the dense vectors in RAM: float32 originals (unless on disk), plus
    the quantized copies (1 byte a dimension for int8, 1 bit for binary) when ``always_ram``."""
    originals = 0 if options.on_disk else n * dim * 4
    quantized = {"none": 0, "int8": n * dim, "binary": n * dim // 8}[options.quantization]
    return (originals + (quantized if options.always_ram else 0)) / 2**20


def allocated_mb(path: Path) -> float:
    """Disk blocks in use under ``path`` (as ``du``: Qdrant preallocates sparse 32 MiB files)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) / 2**20


# A fresh process: load one shard, run the queries' dense + BM25 prefetches fused by RRF, report
# what its memory grew by (kB in /proc/self/status).
MEMORY = """
import json, sys
import qdrant_edge as qe
def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) for k in ("RssAnon", "RssFile")}
shard_path, queries_path, quantized = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
queries = json.load(open(queries_path))
before = status()
shard = qe.EdgeShard.load(shard_path)
params = None
if quantized:
    q = qe.QuantizationSearchParams(rescore=quantized["rescore"], oversampling=quantized["oversampling"])
    params = qe.SearchParams(quantization=q)
for dense, (indices, values) in queries:
    shard.query(qe.QueryRequest(limit=5, with_payload=True, query=qe.Fusion.Rrf(k=2), prefetches=[
        qe.Prefetch(limit=100, query=qe.Query.Nearest(dense, using="dense"), params=params),
        qe.Prefetch(limit=100, query=qe.Query.Nearest(qe.SparseVector(indices=indices, values=values),
                                                      using="bm25")),
    ]))
after = status()
print(json.dumps({k: (after[k] - before[k]) / 1024 for k in before}))
"""


def memory_mb(shard: Path, queries: Path, options: CollectionOptions) -> dict[str, float]:
    quantized: dict[str, float] | None = {"rescore": options.rescore, "oversampling": options.oversampling}
    if options.quantization == "none":
        quantized = None
    out = subprocess.run([sys.executable, "-c", MEMORY, str(shard), str(queries), json.dumps(quantized)],
                         capture_output=True, text=True, check=True, timeout=600)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def search_timings(url: str, collection: str, questions: list[Question], clients: int) -> dict[str, float]:
    """Hybrid searches of every question, ``clients`` at a time: latency p50 / p99 (ms), q/s, Recall@5."""

    def one(q: Question, http: httpx.Client) -> tuple[float, float]:
        body = {"collection": collection, "queries": [q.question], "top_k": 5, "mode": "hybrid"}
        start = time.perf_counter()
        response = http.post(f"{url}/v1/search", json=body)
        took = time.perf_counter() - start
        response.raise_for_status()
        found = {h["id"] for h in response.json()["results"][0]}
        gold = gold_ids(q)
        return took, len(found & gold) / len(gold)

    shares = [questions[i::clients] for i in range(clients)]

    def worker(share: list[Question]) -> list[tuple[float, float]]:
        with httpx.Client(timeout=120) as http:
            return [one(q, http) for q in share]

    with httpx.Client(timeout=120) as http:  # warm-up: the encoder's first calls, the page cache
        for q in questions[:20]:
            one(q, http)
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool_:
        rows = [row for part in pool_.map(worker, shares) for row in part]
    wall = time.perf_counter() - start
    latencies = [1000 * t for t, _ in rows]
    return {
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "qps": round(len(rows) / wall, 1),
        "recall@5": round(statistics.mean(r for _, r in rows), 3),
    }


def run(data: Path, n: int, n_queries: int, out: Path, seed: int, batch_size: int) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    storage, logs = out / "qdrant", out / "logs"
    corpus, questions = build_corpus(data, n, seed)
    questions = random.Random(seed).sample(questions, min(n_queries, len(questions)))
    path = out / "corpus.jsonl"
    write_flashrag(path, corpus)
    needles = sum(not d.id.startswith("distractor-") for d in corpus)
    print(f"corpus: {len(corpus):,} passages ({needles:,} needles, {len(corpus) - needles:,} distractors), "
          f"{path.stat().st_size / 2**20:.1f} MiB; {len(questions)} questions", flush=True)  # fmt: skip

    env = {"RETRIEVER_STORAGE_PATH": str(storage), "QDRANT_URL": ""}
    cores = len(os.sched_getaffinity(0))
    fanout.use_eager(True)
    load = os.getloadavg()[0]
    with local_process("retriever", env, logs) as url:
        summary = ingest_corpus(str(path), "ingested", url, batch_size=batch_size, window=4)
    load = round((load + os.getloadavg()[0]) / 2, 1)  # other processes share the cores
    rate = summary["passages_per_s"]
    print(f"ingest: {summary['sent_passages']:,} passages in {summary['seconds']:.0f} s = {rate:.1f}/s on "
          f"{cores} cores = {rate / cores:.1f}/s per core ({summary['embedder']})", flush=True)  # fmt: skip

    settings = RetrieverSettings(storage_path=storage)
    embedder = load_embedder(settings.embedder, settings.embed_backend, settings.embed_max_length)
    store = EdgeStore(storage)
    try:
        # Every variant is a copy, built the same way, so that they differ by their options only: a
        # copy's shard held ~35 MB more heap than the ingested one with the same options (20k points).
        sizes: dict[str, dict[str, float]] = {}
        for name, options in VARIANTS.items():
            copy_collection(store, "ingested", name, options)
            start = time.perf_counter()
            store.optimize(name)
            sizes[name] = {"optimize_s": round(time.perf_counter() - start, 1)}
            sizes[name]["vectors_ram_mb"] = round(
                vectors_in_ram_mb(len(corpus), int(store.meta(name)["dim"]), options), 1
            )
        bm25 = Bm25(avgdl=float(store.meta("ingested")["avgdl"]))
    finally:
        store.close()
    dense = embedder.encode([q.question for q in questions])
    queries = out / "queries.json"
    queries.write_text(
        json.dumps(
            [[v.tolist(), list(bm25.query(q.question))] for v, q in zip(dense, questions, strict=True)]
        )
    )
    for name, options in VARIANTS.items():
        shard = storage / name / "shard"
        sizes[name] |= {
            "disk_mb": round(allocated_mb(shard / "segments"), 1),
            "wal_mb": round(allocated_mb(shard / "wal"), 1),
        } | {f"{k}_mb": round(v, 1) for k, v in memory_mb(shard, queries, options).items()}
        print(f"size {name}: {sizes[name]}", flush=True)

    search: dict[str, dict[int, dict[str, float]]] = {}
    with local_process("retriever", env, logs) as url:
        for name in VARIANTS:
            search[name] = {c: search_timings(url, name, questions, c) for c in (1, 16)}
            print(f"search {name}: {search[name]}", flush=True)
    return {
        "n": len(corpus), "needles": needles, "questions": len(questions), "cores": cores, "load": load,
        "ingest": {"passages_per_s": rate, "per_core": round(rate / cores, 1), "seconds": summary["seconds"],
                   "optimize_s": summary["optimize_s"],
                   "batch_size": batch_size, "embedder": summary["embedder"]},
        "size": sizes, "search": search,
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    ingest = result["ingest"]
    lines = [
        f"corpus: {result['n']:,} passages ({result['needles']:,} needles); {result['questions']} questions; "
        f"{result['cores']} cores (load average {result['load']} during the ingest)",
        f"ingest: {ingest['passages_per_s']:.1f} passages/s = {ingest['per_core']:.1f}/s per core "
        f"({ingest['embedder']}, batches of {ingest['batch_size']}); its optimize {ingest['optimize_s']} s",
        "",
        "| vectors | dense in RAM MB | disk MB | WAL MB | RssAnon MB | RssFile MB | optimize s "
        "| p50 / p99 ms (1) | q/s (1) | p50 / p99 ms (16) | q/s (16) | R@5 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, size in result["size"].items():
        one, many = result["search"][name][1], result["search"][name][16]
        lines.append(
            f"| {name} | {size['vectors_ram_mb']} | {size['disk_mb']} | {size['wal_mb']} "
            f"| {size['RssAnon_mb']} | {size['RssFile_mb']} "
            f"| {size['optimize_s']} | {one['p50_ms']} / {one['p99_ms']} | {one['qps']} "
            f"| {many['p50_ms']} / {many['p99_ms']} | {many['qps']} | {one['recall@5']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="folder of question files")
    parser.add_argument("--n", type=int, default=20_000, help="passages in the corpus")
    parser.add_argument("--queries", type=int, default=300, help="questions searched per setting")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(".hoprl/bench-corpus"), help="a fresh folder")
    args = parser.parse_args()
    if (args.out / "qdrant").exists():
        parser.error(
            f"{args.out / 'qdrant'} exists; give a fresh --out (the bench builds its collections anew)"
        )
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # a busy 2-core box
    result = run(args.data, args.n, args.queries, args.out, args.seed, args.batch_size)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(report(result))


if __name__ == "__main__":
    main()
