"""Retrieval benchmark: the retriever service against a plain reference, in one run.

    python bench/retrieval.py --data ../shared/data/hotpotqa_dev.jsonl      (make bench)

Measures, on the pooled corpus of the file with its questions as queries:
- index build rate (paragraphs/s) through the service's ingest route;
- single-query latency p50 / p99 of hybrid search over HTTP (query embedding included);
- batched throughput (queries/s) at batch 32.
The reference does the same work the plain way: fp32 transformers encoding (what
sentence-transformers does), brute-force numpy cosine, an in-memory BM25 inverted index and RRF
in Python. Timings on shared machines are noisy: medians, and ratios within the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.jsonl import load_questions
from hoprl.embedding import Embedder
from hoprl.schemas import Document
from services.local import LocalServer
from services.retriever.app import create_app
from services.retriever.index import dense_text
from services.retriever.settings import RetrieverSettings
from services.retriever.sparse import tokenize


class Reference:
    """Brute-force dense + in-memory BM25 + RRF: the plain way to do hybrid retrieval."""

    def __init__(self, documents: list[Document], k1: float = 1.2, b: float = 0.75) -> None:
        self.embedder = Embedder(bf16=False)
        self.matrix = self.embedder.encode([dense_text(d) for d in documents])
        self.postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        tokens = [tokenize(f"{d.title} {d.text}") for d in documents]
        avgdl = sum(map(len, tokens)) / len(tokens)
        for i, toks in enumerate(tokens):
            counts: dict[str, int] = defaultdict(int)
            for t in toks:
                counts[t] += 1
            norm = k1 * (1 - b + b * len(toks) / avgdl)
            for t, tf in counts.items():
                self.postings[t].append((i, tf * (k1 + 1) / (tf + norm)))
        n = len(documents)
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    def bm25(self, query: str, depth: int) -> list[int]:
        scores: dict[int, float] = defaultdict(float)
        for t in set(tokenize(query)):
            for i, v in self.postings.get(t, []):
                scores[i] += self.idf[t] * v
        return sorted(scores, key=scores.__getitem__, reverse=True)[:depth]

    def search(
        self, queries: list[str], top_k: int = 10, depth: int = 50, rrf_k: int = 60
    ) -> list[list[int]]:
        dense = self.embedder.encode(queries) @ self.matrix.T
        out = []
        for q, row in zip(queries, dense, strict=True):
            fused: dict[int, float] = defaultdict(float)
            for ranking in (list(np.argsort(-row)[:depth]), self.bm25(q, depth)):
                for rank, i in enumerate(ranking):
                    fused[int(i)] += 1.0 / (rrf_k + rank)
            out.append(sorted(fused, key=fused.__getitem__, reverse=True)[:top_k])
        return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def time_single(fn: Callable[[list[str]], object], queries: list[str]) -> list[float]:
    for q in queries[:5]:
        fn([q])  # warm-up
    times = []
    for q in queries:
        start = time.perf_counter()
        fn([q])
        times.append((time.perf_counter() - start) * 1000)
    return times


def time_batched(fn: Callable[[list[str]], object], queries: list[str], batch: int = 32) -> float:
    fn(queries[:batch])
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        fn(queries[i : i + batch])
    return len(queries) / (time.perf_counter() - start)


def run(data: Path, n_queries: int) -> dict[str, dict[str, Any]]:
    questions = load_questions(data)
    documents = pool(questions)
    queries = [q.question for q in questions][:n_queries]
    results: dict[str, dict[str, Any]] = {}

    with tempfile.TemporaryDirectory() as storage:
        settings = RetrieverSettings(storage_path=Path(storage))
        with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
            client.ingest("warmup", documents[:32])
            start = time.perf_counter()
            for i in range(0, len(documents), 256):
                client.ingest("bench", documents[i : i + 256])
            build = len(documents) / (time.perf_counter() - start)
            single = time_single(lambda qs: client.search("bench", qs, top_k=10, mode="hybrid"), queries)
            batched = time_batched(lambda qs: client.search("bench", qs, top_k=10, mode="hybrid"), queries)
    results["service"] = {
        "build": build,
        "p50": statistics.median(single),
        "p99": percentile(single, 99),
        "qps32": batched,
    }

    start = time.perf_counter()
    reference = Reference(documents)
    build = len(documents) / (time.perf_counter() - start)
    single = time_single(reference.search, queries)
    batched = time_batched(reference.search, queries)
    results["reference"] = {
        "build": build,
        "p50": statistics.median(single),
        "p99": percentile(single, 99),
        "qps32": batched,
    }
    results["meta"] = {
        "documents": len(documents),
        "queries": len(queries),
        "threads": torch.get_num_threads(),
        "encoder": f"{settings.embed_backend}, {settings.embed_max_length} tokens",
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data/hotpotqa_dev.jsonl"))
    parser.add_argument("--queries", type=int, default=300, help="questions used as queries")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line")
    args = parser.parse_args()
    results = run(args.data, args.queries)
    if args.json:
        print(json.dumps(results))
        return
    svc, ref, meta = results["service"], results["reference"], results["meta"]
    print(
        f"corpus: {args.data} -> {meta['documents']:.0f} paragraphs; {meta['queries']:.0f} queries; "
        f"torch threads {meta['threads']:.0f}; service encoder {meta['encoder']}"
    )
    print(f"{'metric':34} {'service':>10} {'reference':>10} {'ratio':>8}")
    rows = [
        ("index build (paragraphs/s)", "build", True),
        ("hybrid single query p50 (ms)", "p50", False),
        ("hybrid single query p99 (ms)", "p99", False),
        ("hybrid batch-32 throughput (q/s)", "qps32", True),
    ]
    for label, key, higher in rows:
        ratio = svc[key] / ref[key] if higher else ref[key] / svc[key]
        print(f"{label:34} {svc[key]:10.1f} {ref[key]:10.1f} {ratio:7.1f}x")
    print("ratio: how many times better the service is than the reference (speed or latency)")


if __name__ == "__main__":
    main()
