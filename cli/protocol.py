"""``hoprl eval-answers --protocol <recipe>``: a paper's evaluation, set by set, beside its figures.

For each evaluation set of :data:`hoprl.protocols.PROTOCOLS` ``[recipe]``: the questions come from
``--data-dir`` (``../shared/data``) or, with ``--from-hub``, from the Hugging Face hub; a set that
is on neither is skipped with a line that says why. ``--corpus COLLECTION`` (a corpus ingested with
``hoprl ingest-corpus``) is the open-domain setting: every set searches it, gold paragraphs matched
in it by title and text; a set whose questions carry no paragraphs (NQ, TriviaQA, PopQA, Bamboogle)
runs only with it and is skipped, saying so, without. Each set's lines name where the paper
retrieves from (:meth:`hoprl.protocols.Protocol.setting`) and where this run does.

The paper's sample (a seeded random one where the paper samples), then ``--limit`` of it, go through
``/v1/answer`` at the paper's step cap and decoding (:class:`hoprl.answer_eval.AnswerSettings`),
then R2AG's generation step; where the paper reports a judge's accuracy the judge service grades the
answers (its backend is printed: the paper's LLM judge or the rules fallback). Each set's table
shows the paper's rows beside ours: compared when the served model is the paper's backbone, else
labelled with the paper's model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hoprl.domain import Question
from hoprl.protocols import (
    METRIC_KEYS,
    PROTOCOLS,
    EvalSet,
    Protocol,
    get_protocol,
    headlines,
    local_file,
    served_backbone,
)
from hoprl.protocols import sample as paper_sample

console = Console(stderr=True)
JUDGE_BATCH = 64


def add_arguments(parser: argparse.ArgumentParser, protocol_help: str, data_dir_help: str) -> None:
    """``--protocol RECIPE`` (a paper's evaluation, :data:`hoprl.protocols.PROTOCOLS`) and
    ``--data-dir`` (where its benchmark files are, ``../shared/data``)."""
    parser.add_argument("--protocol", default=None, choices=sorted(PROTOCOLS), help=protocol_help)
    parser.add_argument("--data-dir", default="../shared/data", help=data_dir_help)


def load_set(evalset: EvalSet, args: argparse.Namespace) -> tuple[list[Question] | None, str]:
    """The set's questions and where they came from, or None and the reason it is skipped."""
    from hoprl.data.hub import HUB, hub_location, load_hub
    from hoprl.data.jsonl import load_questions

    path = local_file(evalset, args.data_dir)
    if path is not None:
        return load_questions(path), str(path)
    size = f"{evalset.questions:,} questions" if evalset.questions else "its size is not given"
    why = f"{evalset.dataset} ({evalset.split}, {size}; {evalset.source}) is not in {args.data_dir}"
    if evalset.dataset not in HUB:
        return None, f"{why}, and hoprl.data.hub has no loader for it"
    if not args.from_hub:
        return None, f"{why}: pass --from-hub on a machine that reaches the Hugging Face hub"
    if evalset.split not in HUB[evalset.dataset].splits:
        return None, f"{why}, and hoprl.data.hub has no {evalset.split} split for it"
    repo, config, split = hub_location(evalset.dataset, evalset.split)
    return load_hub(evalset.dataset, evalset.split), f"hub {repo} ({config or 'default'}, {split})"


def judge_verdicts(
    judge_url: str, rows: list[dict[str, Any]], questions: dict[str, Question]
) -> dict[str, Any]:
    """Judge accuracy over ``rows`` (an unanswerable question is right when refused) and the backend."""
    from hoprl.clients.judge import JudgeClient
    from hoprl.schemas.judge import AnswerItem

    graded = [r for r in rows if r["answers"]]
    items = [AnswerItem(question=questions[r["id"]].question, prediction=r["prediction"] or "",
                        references=r["answers"]) for r in graded]  # fmt: skip
    with JudgeClient(judge_url) as client:
        verdicts = [
            v for i in range(0, len(items), JUDGE_BATCH) for v in client.answer(items[i : i + JUDGE_BATCH])
        ]
    by_id = {r["id"]: v.verdict for r, v in zip(graded, verdicts, strict=True)}
    right = [by_id.get(r["id"], r["outcome"] == "refuse") for r in rows]
    backends = sorted({f"{v.backend}{' (fallback)' if v.fallback else ''}" for v in verdicts})
    prompts = sorted({v.version for v in verdicts})
    return {
        "judge_accuracy": sum(right) / max(1, len(right)),
        "judge_backend": ", ".join(backends) or "-",
        "judge_prompt": ", ".join(prompts) or "-",
    }


def paper_rows(protocol: Protocol, dataset: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's rows for ``dataset`` with our figure in the paper's unit; ``compared`` when the
    served model is the row's backbone (otherwise the row is the paper's model's result only)."""
    out = []
    for h in headlines(protocol.recipe, dataset):
        ours = report.get(METRIC_KEYS.get(h.metric, h.metric))
        compared = served_backbone(report.get("model", ""), h.model)
        out.append({**h.__dict__, "ours": None if ours is None else ours * h.scale, "compared": compared})
    return out


def set_table(protocol: Protocol, evalset: EvalSet, report: dict[str, Any]) -> Table:
    """One row per protocol metric with this run's figure (in the paper's unit), then the paper's rows
    for it: with the difference when the served model is the paper's backbone, else labelled as the
    paper's model's result."""
    where = f"corpus {report['collection']}" if report.get("corpus") else "the questions' paragraphs"
    title = (f"{protocol.paper} protocol: {evalset.dataset} {evalset.split}, "
             f"{report['questions']} questions, model {report.get('model') or '?'}, retrieving from "
             f"{where} (the paper: {protocol.setting(evalset)})")  # fmt: skip
    table = Table(title=title)
    for column in ("metric", "this run", "paper", "ours - paper", "paper's model", "source"):
        table.add_column(
            column, justify="left" if column in ("metric", "paper's model", "source") else "right"
        )
    for metric in protocol.metrics:
        rows = [r for r in report["paper"] if r["metric"] == metric]
        key = METRIC_KEYS[metric]
        scale = rows[0]["scale"] if rows else 1.0
        ours = f"{report[key] * scale:.3g}" if key in report else "-"
        table.add_row(metric, ours, "", "", "", "this run")
        for r in rows:
            diff = f"{r['ours'] - r['value']:+.3g}" if r["compared"] and r["ours"] is not None else ""
            label = r["model"] if r["compared"] else f"{r['model']} (the paper's, not this run's)"
            table.add_row("", "", f"{r['value']:g}", diff, label, r["source"])
    if "judge_backend" in report:
        table.add_row(
            "judge backend", report["judge_backend"], "", "", f"paper: {protocol.judge}", "this run"
        )
    if "judge_prompt" in report and protocol.judge_prompt:
        same = report["judge_prompt"] == protocol.judge_prompt
        wanted = f"JUDGE_ANSWER_PROMPT={protocol.judge_prompt}"
        note = "the paper's" if same else f"not the paper's: run the judge with {wanted}"
        table.add_row("judge prompt", report["judge_prompt"], "", "", note, "this run")
    return table


def retrieval_note(protocol: Protocol, evalset: EvalSet, corpus: str | None) -> str:
    """Where this run retrieves ``evalset``'s evidence from, beside where the paper does."""
    here = (f"retrieving from the corpus {corpus} (open-domain; gold paragraphs matched by title, then "
            "text)" if corpus else "retrieving from the questions' own paragraphs")  # fmt: skip
    paper = protocol.setting(evalset)
    if evalset.open_domain and protocol.corpus and not corpus:
        return f"{here}; the paper: {paper}. Pass --corpus COLLECTION for its setting"
    return f"{here}; the paper: {paper}"


def run_protocol(
    args: argparse.Namespace, policy_url: str, retriever_url: str, judge_url: str | None
) -> list[dict]:
    """Evaluate every set of ``args.protocol`` that can be loaded; print why the others are skipped."""
    from hoprl.answer_eval import AnswerSettings, evaluate_answers

    protocol = get_protocol(args.protocol)
    corpus = f"{protocol.corpus} ({protocol.corpus_source})" if protocol.corpus else "own paragraphs"
    console.print(
        f"{protocol.paper}: retrieves from {corpus}; "
        f"steps {protocol.max_steps or 'service default'} ({protocol.steps_source}); "
        f"temperature {protocol.temperature}, top-p {protocol.top_p} ({protocol.decoding_source}); "
        f"metrics {', '.join(protocol.metrics)} ({protocol.metrics_source})"
    )
    reports = []
    chosen_sets = [s for s in protocol.sets if not args.datasets or s.dataset in args.datasets]
    if not chosen_sets:
        console.print(
            f"[red]error:[/red] {protocol.paper} evaluates {', '.join(s.dataset for s in protocol.sets)}"
        )
    for evalset in chosen_sets:
        questions, origin = load_set(evalset, args)
        if questions is None:
            console.print(f"[yellow]skip[/yellow] {origin}")
            continue
        if not any(q.paragraphs for q in questions) and not args.corpus:
            console.print(
                f"[yellow]skip[/yellow] {evalset.dataset}: its questions carry no paragraphs, so it needs "
                f"a corpus: ingest one ({protocol.corpus or 'a Wikipedia dump'}) with hoprl ingest-corpus "
                "and pass --corpus COLLECTION"
            )
            continue
        console.print(f"{evalset.dataset}: {retrieval_note(protocol, evalset, args.corpus)}")
        chosen = paper_sample(questions, evalset, args.seed)
        console.print(
            f"{evalset.dataset}: {len(chosen)} of {len(questions)} questions from {origin} "
            f"(the paper: {evalset.questions or 'not given'}); answering {args.limit or len(chosen)}"
        )
        report = evaluate_answers(
            policy_url, retriever_url, chosen, recipe=protocol.recipe, collection=args.corpus,
            limit=args.limit, concurrency=args.concurrency, repeatable=args.repeatable,
            settings=AnswerSettings.of(protocol, seed=args.seed, dataset=evalset.dataset),
            batch_size=args.batch_size, corpus=bool(args.corpus),
        )  # fmt: skip
        rows = report.pop("predictions")
        models = {r["model"] for r in rows if r.get("model")}
        report["model"] = models.pop() if len(models) == 1 else ", ".join(sorted(models))
        if "judge" in protocol.metrics and judge_url:
            report |= judge_verdicts(judge_url, rows, {q.id: q for q in chosen})
        report |= {"protocol": protocol.recipe, "dataset": evalset.dataset, "split": evalset.split,
                   "source": origin, "paper_setting": protocol.setting(evalset)}  # fmt: skip
        report["paper"] = paper_rows(protocol, evalset.dataset, report)
        reports.append(report)
    return reports


def print_reports(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    if args.json:
        print(json.dumps(reports))
        return
    out = Console(width=max(110, Console().width))
    protocol = get_protocol(args.protocol)
    for report in reports:
        evalset = next(s for s in protocol.sets if s.dataset == report["dataset"])
        out.print(set_table(protocol, evalset, report))
    if not reports:
        out.print(f"no evaluation set of {protocol.paper} could be loaded from {Path(args.data_dir)}")
