"""``hoprl ingest-corpus``: a Wikipedia-scale passage file into a retriever collection, resumably.

Runs the Prefect flow :func:`flows.corpus.ingest_corpus` against a running retriever (``--url``
or ``HOPRL_RETRIEVER_URL``), else against one started in this process on embedded storage
(``--storage``). Embedding batches run in this process unless ``HOPRL_CELERY_BROKER_URL`` names a
Redis, where ``celery -A flows.fanout worker`` processes take them. Killed, the same command
resumes where the collection's progress record says::

    hoprl ingest-corpus wiki18_100w.jsonl --collection wiki18 --on-disk --quantization int8
    hoprl ingest-corpus psgs_w100.tsv --collection wiki-dpr --url http://127.0.0.1:8001 --batch-size 512
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

console = Console(stderr=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=Path, help="the passage file: FlashRAG .jsonl or DPR .tsv (either .gz too)"
    )
    parser.add_argument("--collection", required=True, help="the retriever collection to fill")
    parser.add_argument(
        "--format", choices=["flashrag", "dpr"], default=None, help="default: from the file name"
    )
    parser.add_argument(
        "--batch-size", type=int, default=256, help="passages per batch (a resumed ingest keeps its own)"
    )
    parser.add_argument(
        "--window", type=int, default=8, help="batches in flight at once (more with more workers)"
    )
    parser.add_argument("--queue", default=None, help="the Celery queue of the embedding units")
    parser.add_argument(
        "--url", default=None, help="a running retriever (default: $HOPRL_RETRIEVER_URL, else one here)"
    )
    parser.add_argument(
        "--storage",
        type=Path,
        default=None,
        help="embedded storage of a retriever started here (default .hoprl/qdrant)",
    )
    size = parser.add_argument_group("collection options (fixed when the collection is created)")
    size.add_argument("--on-disk", action="store_true", help="dense vectors memory-mapped from disk")
    size.add_argument("--hnsw-on-disk", action="store_true", help="the HNSW graph memory-mapped from disk")
    size.add_argument("--sparse-on-disk", action="store_true", help="the BM25 sparse indexes on disk")
    size.add_argument("--quantization", choices=["none", "int8", "binary"], default="none")
    size.add_argument(
        "--no-always-ram", action="store_true", help="let the quantized vectors live on disk too"
    )
    size.add_argument("--no-rescore", action="store_true", help="rank by the quantized vectors alone")
    size.add_argument("--oversampling", type=float, default=1.0, help="quantized candidates per result")
    size.add_argument("--shards", type=int, default=1, help="shard_number (a Qdrant server only)")
    size.add_argument("--replicas", type=int, default=1, help="replication_factor (a Qdrant cluster only)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The :class:`~hoprl.schemas.retriever.CollectionOptions` the flags ask for; None without
    any (a new collection gets the defaults, an existing one keeps its own: a resume needs no
    flags repeated)."""
    from hoprl.schemas.retriever import CollectionOptions

    asked = {
        "on_disk": args.on_disk, "hnsw_on_disk": args.hnsw_on_disk, "sparse_on_disk": args.sparse_on_disk,
        "quantization": args.quantization, "always_ram": not args.no_always_ram,
        "rescore": not args.no_rescore, "oversampling": args.oversampling, "shard_number": args.shards,
        "replication_factor": args.replicas,
    }  # fmt: skip
    return asked if asked != CollectionOptions().model_dump() else None


def run(args: argparse.Namespace, retriever_url: str) -> dict[str, Any]:
    """The flow under the Prefect API ``hoprl pipeline`` picks (:func:`cli.pipeline.prefect_settings`)."""
    from cli.pipeline import prefect_settings
    from flows import fanout
    from flows.corpus import ingest_corpus
    from hoprl.settings import get_settings

    fanout.use_eager(get_settings().celery_broker_url is None)
    with prefect_settings():
        return ingest_corpus(
            str(args.path), args.collection, retriever_url, format=args.format, batch_size=args.batch_size,
            options=options(args), window=args.window, queue=args.queue,
        )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from hoprl.settings import get_settings

    url = args.url or get_settings().retriever_url
    with ExitStack() as stack:
        if not url:
            from services.local import LocalServer
            from services.retriever.app import create_app
            from services.retriever.settings import RetrieverSettings

            settings = RetrieverSettings(storage_path=args.storage) if args.storage else RetrieverSettings()
            console.print(f"starting the retriever on the embedded default ({settings.storage_path})")
            url = stack.enter_context(LocalServer(create_app(settings))).url
        summary = run(args, url)
    if args.json:
        print(json.dumps(summary))
    else:
        resumed = (
            f", {summary['resumed_passages']:,} stored by an earlier run"
            if summary["resumed_passages"]
            else ""
        )
        console.print(
            f"{summary['collection']}: {summary['points']:,} points; {summary['passages']:,} passages in "
            f"{summary['batches']:,} batches{resumed}; this run embedded {summary['sent_passages']:,} at "
            f"{summary['passages_per_s']:,.1f}/s ({summary['embedder']})"
        )
    return 0
