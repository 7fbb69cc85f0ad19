"""``hoprl``: one command line for everything a user runs.

Examples::

    hoprl serve retriever --port 8001
    hoprl eval-retrieval --data ../shared/data/hotpotqa_dev.jsonl --mode hybrid --k 2 5 10
    hoprl eval-answers --protocol r2ag --limit 3
    hoprl eval-answers --data ../shared/data/hotpotqa_dev.jsonl --recipe search-r1 --corpus wiki18
    hoprl ingest-corpus wiki18_100w.jsonl --collection wiki18 --on-disk --quantization int8
    hoprl synth --seed 0 --out data/synthetic
    hoprl reward --recipe evo-rag episode.json
    hoprl train --config configs/search-r1.yaml --small --wait
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# name -> the ASGI app of that service (later issues add policy, judge and trainer)
SERVICES = {
    "retriever": "services.retriever.app:app",
    "policy": "services.policy.app:app",
    "judge": "services.judge.app:app",
    "trainer": "services.trainer.app:app",
}
TIMEOUT_VAR = "POLICY_REQUEST_TIMEOUT_S"
DEFAULT_PORTS = {"retriever": 8001, "policy": 8002, "judge": 8003, "trainer": 8004}

console = Console(stderr=True)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from hoprl.clients.http import SERVER_KEEP_ALIVE_S

    if args.service not in SERVICES:
        console.print(f"[red]unknown service {args.service!r}; valid: {', '.join(SERVICES)}")
        return 2
    port = args.port or DEFAULT_PORTS[args.service]
    uvicorn.run(SERVICES[args.service], host=args.host, port=port, log_level=args.log_level,
                timeout_keep_alive=SERVER_KEEP_ALIVE_S)  # fmt: skip
    return 0


def cmd_reward(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from hoprl.data.jsonl import iter_questions
    from hoprl.recipes import get_recipe
    from hoprl.recipes.scoring import explain, load_episode

    text = sys.stdin.read() if str(args.episode) == "-" else args.episode.read_text()
    try:
        episode = load_episode(json.loads(text))
    except json.JSONDecodeError as exc:
        console.print(f"[red]error:[/red] {args.episode} is not JSON: {exc}")
        return 2
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        console.print(f"[red]error:[/red] {args.episode} is not an episode: {problems}")
        return 2
    question = None
    if args.data:
        question = next((q for q in iter_questions(args.data) if q.id == episode.question_id), None)
        if question is None:
            console.print(f"[red]error:[/red] question {episode.question_id!r} is not in {args.data}")
            return 2
    try:
        recipe = get_recipe(args.recipe or episode.recipe, **json.loads(args.config))
        ledger = None
        if args.judge_url and hasattr(recipe, "judge"):  # when-to-search's r_a, EVO-RAG's r_ref
            from hoprl.clients.judge import RemoteJudge
            from hoprl.judging import JudgeLedger

            ledger = recipe.judge = JudgeLedger(RemoteJudge(args.judge_url), expected="openai", bound=True)
        report = explain(recipe, episode, question)
    except (KeyError, ValueError, ValidationError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    if ledger is not None:
        report["judge"] = ledger.metrics()
    print(json.dumps(report, indent=2))
    return 0


def _results_table(report: object) -> Table:
    from hoprl.evaluation import RetrievalEval

    assert isinstance(report, RetrievalEval)
    first = next(iter(report.results.values()))
    columns = [c for c in first if c != "questions"]
    table = Table(title=f"retrieval on {report.collection} ({report.documents} paragraphs)")
    table.add_column("mode")
    for c in columns:
        table.add_column(
            c.replace("full_recall", "FullR").replace("recall", "R").replace("map", "mAP"), justify="right"
        )
    for mode, metrics in report.results.items():
        table.add_row(mode, *(f"{metrics[c]:.3f}" for c in columns))
    return table


def cmd_eval_retrieval(args: argparse.Namespace) -> int:
    from hoprl.clients.retriever import RetrieverClient
    from hoprl.data.sources import load
    from hoprl.evaluation import evaluate_retrieval

    questions = load(args.data, split=args.split, limit=args.limit)
    name = Path(args.data).stem if Path(args.data).exists() else args.data.replace(":", "-")
    try:
        if args.url:
            with RetrieverClient(args.url) as client:
                report = evaluate_retrieval(client, questions, args.mode, args.k, name, args.corpus)
        else:
            from services.local import LocalServer
            from services.retriever.app import create_app
            from services.retriever.settings import RetrieverSettings

            settings = RetrieverSettings(storage_path=args.storage) if args.storage else RetrieverSettings()
            console.print(f"starting the retriever on the embedded default ({settings.storage_path})")
            with LocalServer(create_app(settings)) as server, RetrieverClient(server.url) as client:
                report = evaluate_retrieval(client, questions, args.mode, args.k, name, args.corpus)
    except ValueError as exc:  # a --corpus that does not exist
        console.print(f"[red]error:[/red] {exc}")
        return 2
    if args.json:
        print(
            json.dumps(
                {
                    "collection": report.collection,
                    "documents": report.documents,
                    "index_rate": report.index_rate,
                    "results": report.results,
                }
            )
        )
    else:
        out = Console(width=max(100, Console().width))
        out.print(_results_table(report))
        if report.index_rate:
            out.print(f"indexed {report.documents} paragraphs at {report.index_rate:.0f}/s")
    return 0


def cmd_eval_answers(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from hoprl.answer_eval import evaluate_answers
    from hoprl.data.sources import load

    if bool(args.data) == bool(args.protocol):
        console.print("[red]error:[/red] give --data (with --recipe) or --protocol <recipe>, one of them")
        return 2
    questions = load(args.data, split=args.split) if args.data else []
    with ExitStack() as stack:
        retriever_url = args.retriever_url
        if not retriever_url:
            from services.local import LocalServer
            from services.retriever.app import create_app as retriever_app

            retriever_url = stack.enter_context(LocalServer(retriever_app())).url
        policy_url = args.policy_url
        if not policy_url:
            from services.local import LocalServer
            from services.policy.app import create_app as policy_app
            from services.policy.settings import PolicySettings

            # A paper's protocol runs long episodes (EVO-RAG: 20 steps); on a CPU one can take minutes.
            settings = PolicySettings(retriever_url=retriever_url)
            if args.protocol and not os.environ.get(TIMEOUT_VAR):
                settings.request_timeout_s = 3600.0
            policy = policy_app(settings)
            policy_url = stack.enter_context(LocalServer(policy)).url
        if args.protocol:
            from cli import protocol

            judge_url = args.judge_url
            if not judge_url and "judge" in protocol.get_protocol(args.protocol).metrics:
                from services.judge.app import create_app as judge_app
                from services.local import LocalServer

                judge_url = stack.enter_context(LocalServer(judge_app())).url
            try:
                reports = protocol.run_protocol(args, policy_url, retriever_url, judge_url)
            except ValueError as exc:  # e.g. --repeatable with a sampled protocol
                console.print(f"[red]error:[/red] {exc}")
                return 2
            protocol.print_reports(args, reports)
            return 0
        rows = []
        for recipe in args.recipe:
            console.print(f"answering {args.limit or len(questions)} questions with {recipe}")
            report = evaluate_answers(
                policy_url,
                retriever_url,
                questions,
                recipe=recipe,
                collection=args.corpus,
                limit=args.limit,
                concurrency=args.concurrency,
                repeatable=args.repeatable,
                batch_size=args.batch_size,
                corpus=bool(args.corpus),
            )
            report.pop("predictions")
            rows.append(report)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"answers on {args.data}, {setting(args.corpus, rows)}")
    columns = ("recipe", "EM", "F1", "ended %", "retrievals", "K", "R@K", "FullR@K", "p50 s", "errors")
    for column in columns:
        table.add_column(column, justify="left" if column == "recipe" else "right")
    for r in rows:
        agent = [f"{r[k]:.2f}" if k in r else "-" for k in ("agent_k", "agent_recall", "agent_full_recall")]
        table.add_row(
            r["recipe"],
            f"{100 * r['em']:.1f}",
            f"{100 * r['f1']:.1f}",
            f"{100 * r['ended']:.1f}",
            f"{r['retrieval_count']:.2f}",
            *agent,
            f"{r['latency_p50_s']:.2f}",
            str(r["errors"]),
        )
    Console(width=max(100, Console().width)).print(table)
    return 0


def setting(corpus: str | None, rows: list[dict]) -> str:
    """Where the answers retrieved from, as the report's title names it."""
    if not corpus:
        return "retrieving from the questions' own paragraphs (the distractor setting)"
    unmatched = rows[0].get("gold_unmatched", 0) if rows else 0
    return f"retrieving from the corpus {corpus} (open-domain; gold paragraphs not in it: {unmatched})"


def cmd_synth(args: argparse.Namespace) -> int:
    from hoprl.data.jsonl import write_questions
    from hoprl.data.synthetic import generate

    splits = generate(
        seed=args.seed, n_entities=args.entities, n_train=args.train, n_dev=args.dev, n_test=args.test
    )
    for split, questions in splits.items():
        path = Path(args.out) / f"synthetic_{split}.jsonl"
        write_questions(path, questions)
        console.print(f"wrote {len(questions)} questions to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hoprl",
        description="Train and serve multi-hop retrieval agents with reinforcement learning.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples::", 1)[1] if __doc__ else None,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="start a service (HTTP, /v1 paths, /healthz and /readyz)",
        description="Start one hoprl service in the foreground. Settings come from "
        "environment variables with the service's prefix (RETRIEVER_..., QDRANT_URL).",
    )
    serve.add_argument("service", choices=sorted(SERVICES), help="which service")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 in containers)")
    serve.add_argument(
        "--port",
        type=int,
        default=None,
        help="default: retriever 8001, policy 8002, judge 8003, trainer 8004",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=cmd_serve)

    ev = sub.add_parser(
        "eval-retrieval",
        help="index a question file's pooled corpus and score retrieval",
        description="Pool the paragraphs of every question (de-duplicated by title+text), "
        "index them through the retriever service, search with each question and report "
        "Recall@K, Full-Recall@K (every gold paragraph in the top K) and mAP.",
    )
    ev.add_argument("--data", required=True, help="common-schema JSONL path, 'synthetic', or a hub name")
    ev.add_argument("--split", default="dev", help="split for 'synthetic' and hub names")
    ev.add_argument("--limit", type=int, default=None, help="first N questions only")
    ev.add_argument(
        "--mode",
        nargs="+",
        default=["dense", "sparse", "hybrid"],
        choices=["dense", "sparse", "hybrid"],
        help="search modes to compare",
    )
    ev.add_argument("--k", nargs="+", type=int, default=[2, 5, 10], help="cut-offs K")
    ev.add_argument(
        "--url",
        default=None,
        help="a running retriever; default: start one in-process on 127.0.0.1 with embedded storage",
    )
    ev.add_argument(
        "--storage",
        type=Path,
        default=None,
        help="embedded storage folder "
        "(default RETRIEVER_STORAGE_PATH or .hoprl/qdrant); indexes are reused across runs",
    )
    ev.add_argument(
        "--corpus",
        default=None,
        metavar="COLLECTION",
        help="search this corpus collection (hoprl ingest-corpus) instead of indexing the pooled "
        "paragraphs; gold paragraphs are found in it by title, then text",
    )
    ev.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ev.set_defaults(func=cmd_eval_retrieval)

    from cli import protocol as protocol_cli

    ans = sub.add_parser(
        "eval-answers",
        help="answer questions through the policy service; EM/F1 per recipe",
        description="Send each question to POST /v1/answer (the policy runs the recipe's "
        "agent loop against the retriever) and report EM, F1, retrieval count and latency. "
        "Without URLs, a retriever and the default policy model are started in-process.",
    )
    ans.add_argument("--data", default=None, help="common-schema JSONL path, 'synthetic', or a hub name")
    protocol_cli.add_arguments(
        ans,
        "run this paper's evaluation (hoprl/protocols.py) instead of --data/--recipe: its datasets and "
        "splits, step cap, decoding, metrics; its results printed beside ours",
        "--protocol: where the benchmark files are",
    )
    ans.add_argument(
        "--datasets",
        nargs="+",
        default=None,
        help="--protocol: only these of its sets (e.g. hotpotqa musique)",
    )
    ans.add_argument(
        "--from-hub", action="store_true", help="--protocol: load sets missing from --data-dir from the hub"
    )
    ans.add_argument(
        "--corpus",
        "--collection",
        default=None,
        metavar="COLLECTION",
        help="the open-domain setting: search this corpus collection (hoprl ingest-corpus, e.g. a "
        "Wikipedia dump) instead of the questions' pooled paragraphs; gold paragraphs are found in it "
        "by title, then text. --protocol: every set, and the sets without paragraphs (NQ, TriviaQA, "
        "PopQA, Bamboogle) need it",
    )
    ans.add_argument("--seed", type=int, default=0, help="--protocol: the paper's random sample and sampling")
    ans.add_argument(
        "--judge-url", default=None, help="--protocol: a judge service (default: one in-process)"
    )
    ans.add_argument("--split", default="dev")
    ans.add_argument("--recipe", nargs="+", default=["naive-rag"], help="one or more recipe names")
    ans.add_argument(
        "--limit", type=int, default=200, help="first N questions (a fixed sample; --protocol: of each set)"
    )
    ans.add_argument("--concurrency", type=int, default=4)
    ans.add_argument(
        "--repeatable",
        action="store_true",
        help="answer through POST /v1/answer/batch: greedy lock-step rounds, the same answers every run",
    )
    ans.add_argument("--batch-size", type=int, default=16, help="--repeatable: questions per request")
    ans.add_argument("--policy-url", default=None)
    ans.add_argument("--retriever-url", default=None)
    ans.add_argument("--json", action="store_true", help="print the reports as one JSON list")
    ans.set_defaults(func=cmd_eval_answers)

    from cli import corpus as corpus_cli

    ingest = sub.add_parser(
        "ingest-corpus",
        help="index a passage file (FlashRAG JSONL, DPR TSV) into a collection; resumable",
        description="Stream a Wikipedia-scale passage file (FlashRAG's id + contents JSONL, DPR's "
        "id/text/title TSV) in batches into a retriever collection: each batch embedded (dense + BM25) "
        "by the retriever and recorded in the collection's progress once stored, so a killed run "
        "resumes where it stopped. Runs the Prefect flow ingest_corpus; batches fan out to Celery "
        "workers when HOPRL_CELERY_BROKER_URL is set.",
    )
    corpus_cli.add_arguments(ingest)
    ingest.set_defaults(func=corpus_cli.main)

    from cli import pipeline as pipeline_cli

    pipe = sub.add_parser(
        "pipeline",
        help="the whole pipeline: data, index, baseline, SFT, RL, evaluation",
        description="Run the Prefect `pipeline` flow: prepare data, build the index, "
        "evaluate the untrained policy, SFT warm start, RL in segments with the recipe's "
        "curriculum, final evaluation, and a report with plots. Services start as local "
        "processes unless HOPRL_*_URL point at running ones. Re-run with --run-id to resume.",
    )
    pipeline_cli.add_arguments(pipe)
    pipe.set_defaults(func=pipeline_cli.main)

    from cli import demo_rl as demo_rl_cli

    demo = sub.add_parser(
        "demo-rl",
        help="RL over a warm start against a placebo: does RL beat its warm start? (make demo-rl)",
        description="Run the Prefect `demo_rl` flow: a warm start (SFT, or --from a checkpoint), "
        "RL with the real rewards and the same RL with rewards permuted across each batch (the "
        "placebo), the three evaluated on the same test questions, and the paired bootstrap of "
        "each arm against the warm start. Re-run with --run-id to resume.",
    )
    demo_rl_cli.add_arguments(demo)
    demo.set_defaults(func=demo_rl_cli.main)

    from cli import train as train_cli

    train = sub.add_parser(
        "train",
        help="submit a config's job (configs/*.yaml) to a running trainer service",
        description="Submit the job a config file describes (configs/<paper>.yaml: the paper's "
        "settings on GPUs; --small: its toy CPU run) to a trainer service, and with --wait follow "
        "it to its end. Options given here win over the file's values. GPUs: docs/gpus.md.",
    )
    train_cli.add_arguments(train)
    train.set_defaults(func=train_cli.main)

    rew = sub.add_parser(
        "reward",
        help="re-score a stored episode with a recipe's rewards; print them as JSON",
        description="Score EPISODE.json (an episode as /v1/rollouts returns it or the registry "
        "stores it) with the recipe's own reward functions and print every reward, the weighted "
        "total and each step's signals as JSON. ARENA needs --data (its references' gold flags).",
    )
    rew.add_argument("episode", type=Path, help="the episode JSON file ('-' reads standard input)")
    rew.add_argument("--recipe", default=None, help="default: the recipe the episode names")
    rew.add_argument("--data", default=None, help="common-schema JSONL holding the episode's question")
    rew.add_argument(
        "--config", default="{}", help="recipe config overrides as JSON, e.g. '{\"r_eval\": 0.2}'"
    )
    rew.add_argument(
        "--judge-url",
        default=None,
        help="the judge service for the rewards that call a judge (when-to-search, evo-rag); unset: the "
        "recipe's own (rules, or exact match); the report's 'judge' counts the verdicts and fallbacks",
    )
    rew.set_defaults(func=cmd_reward)

    syn = sub.add_parser("synth", help="write the synthetic multi-hop world as JSONL files")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--out", type=Path, default=Path("data/synthetic"))
    syn.add_argument("--entities", type=int, default=300)
    syn.add_argument("--train", type=int, default=600)
    syn.add_argument("--dev", type=int, default=150)
    syn.add_argument("--test", type=int, default=150)
    syn.set_defaults(func=cmd_synth)
    return parser


def app(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from hoprl.data.jsonl import DataError

    try:
        return int(args.func(args))
    except DataError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM ends a command as an exception would, exit status 128 + 15: ``finally`` blocks and
    atexit handlers run. Prefect marks a flow run crashed on SIGTERM and then sends the signal again
    to the handler that was there before; with the default one the process died at once, before
    atexit stopped Prefect's temporary server, which was left running after the command."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        status = app()
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; finally blocks and atexit have run
        print("hoprl: interrupted", file=sys.stderr)
        status = 128 + signal.SIGINT
    sys.exit(status)


if __name__ == "__main__":
    main()
