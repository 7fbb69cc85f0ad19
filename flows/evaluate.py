"""``evaluate``: answer a split through the served policy, score it, store it, publish the report.

One evaluation is what an application would see: every question goes through ``POST /v1/answer``
(:func:`hoprl.answer_eval.evaluate_answers`), so EM / F1, retrieval count and latency include the
agent loop and the HTTP round trips. With ``repeatable=True`` the questions go through
``POST /v1/answer/batch`` instead (greedy lock-step rounds, fixed chunks): the same checkpoint and
index then score the same on every run. On top of that:

- **judge accuracy**: the judge service grades each answer (semantic equivalence, aliases); an
  unanswerable question counts as correct when the agent refused it;
- **the agent's retrieval**: Recall, Full-Recall and mAP of the paragraphs each episode itself
  retrieved, at the number K it retrieved (R2AG's headline metrics; mean K reported), and the mean
  retrieval and generation time per question (T_r / T_g);
- **the index's retrieval**: Recall@K, Full-Recall@K and mAP of the retriever on the run's index,
  with each question as the query, against the gold paragraphs (independent of the policy);
- **the open-domain setting** (``corpus=True``: the collection is a corpus such as a Wikipedia
  dump, with its own passage ids): both retrieval scores count a gold paragraph through the corpus
  passage matched to it by title, then text (:func:`hoprl.evaluation.corpus_gold`);
  ``gold_unmatched`` counts the gold paragraphs the corpus does not hold;
- the evaluation and its per-question predictions are stored in the registry (the paired
  bootstrap against the baseline reads them), the predictions also as
  ``<run folder>/evals/<label>.json``, and the run's report is published again
  (:func:`flows.report.publish_report`).

``label`` names the evaluation in the report (``baseline``, ``final``, ``baseline/naive-rag``);
the one labelled ``baseline`` is what the others are compared against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from flows.progress import AnswerProgress
from flows.report import publish_report
from flows.runs import registry, run_dir
from hoprl.agent.grammar import Turn, grammar
from hoprl.answer_eval import AnswerSettings, evaluate_answers, prepare_collection
from hoprl.clients.judge import JudgeClient
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import gold_ids
from hoprl.data.jsonl import load_questions, write_questions
from hoprl.domain import EpisodeShape, Question, ended_shares
from hoprl.evaluation import SEARCH_BATCH, corpus_gold, gold_sets
from hoprl.metrics.retrieval import retrieval_report
from hoprl.protocols import get_protocol, local_file, sample
from hoprl.registry import Prediction
from hoprl.schemas.judge import AnswerItem

KS = (2, 5, 10)
JUDGE_BATCH = 64
SUMMARY_KEYS = (
    "questions",
    "em",
    "f1",
    "retrieval_count",
    "latency_p50_s",
    "latency_p99_s",
    "retrieval_s",
    "generation_s",
    "errors",
    "outcomes",
    "seconds",
    "ended",
    "agent_recall",
    "agent_full_recall",
    "agent_map",
    "agent_k",
    "steps",
    "model",
    "episode",
    "limited",
    "gold_unmatched",
)


@task(retries=1, retry_delay_seconds=10)
def answer_questions(
    questions: list[Question],
    recipe: str,
    collection: str,
    policy_url: str,
    retriever_url: str,
    out: str,
    repeatable: bool = False,
    protocol: str | None = None,
    shape: EpisodeShape | None = None,
    recipe_config: dict[str, Any] | None = None,
    corpus: bool = False,
    concurrency: int = 4,
    label: str = "answers",
) -> dict[str, Any]:
    """Ask the policy every question (``concurrency`` in flight), logging the progress as
    ``evaluation <label>`` lines (:class:`flows.progress.AnswerProgress`); write the per-question
    rows to ``out``, return the summary.
    ``protocol``: ask as that paper's evaluation does (its episode, decoding, generation step);
    else ``shape``: answer in that episode (a run's own, greedy); else in the service's."""
    dataset = questions[0].dataset if questions else None
    settings = (
        AnswerSettings.of(get_protocol(protocol), dataset=dataset)
        if protocol
        else AnswerSettings(shape=shape, recipe_config=dict(recipe_config or {}))
    )
    lines = AnswerProgress(f"evaluation {label}", len(questions))
    report = evaluate_answers(
        policy_url, retriever_url, questions, recipe, collection, repeatable=repeatable, settings=settings,
        corpus=corpus, concurrency=concurrency, on_answer=lines,
    )  # fmt: skip
    report["model"] = next((r["model"] for r in report["predictions"] if r.get("model")), None)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report["predictions"], indent=1))
    return {k: report[k] for k in SUMMARY_KEYS if k in report}  # agent_*: only with gold paragraphs


@task(retries=2, retry_delay_seconds=5)
def judge_answers(predictions_path: str, questions: list[Question], judge_url: str) -> list[bool]:
    """One verdict per prediction; refusing an unanswerable question is correct.

    Each graded row of the predictions file gets ``judge_llm``: whether an LLM decided it (the
    judge service's ``openai`` backend, no fallback to the rules), which :func:`judge_llm_share`
    sums up for the report."""
    rows = json.loads(Path(predictions_path).read_text())
    by_question = {q.id: q for q in questions}
    graded = [r for r in rows if r["answers"]]
    items = [
        AnswerItem(
            question=by_question[r["id"]].question, prediction=r["prediction"] or "", references=r["answers"]
        )
        for r in graded
    ]
    with JudgeClient(judge_url) as client:
        batches = [items[i : i + JUDGE_BATCH] for i in range(0, len(items), JUDGE_BATCH)]
        judged = [v for batch in batches for v in client.answer(batch)]
    for row, verdict in zip(graded, judged, strict=True):
        row["judge_llm"] = verdict.backend == "openai" and not verdict.fallback
    Path(predictions_path).write_text(json.dumps(rows, indent=1))
    by_id = dict(zip((r["id"] for r in graded), (v.verdict for v in judged), strict=True))
    return [by_id.get(r["id"], r["outcome"] == "refuse") for r in rows]


def judge_llm_share(rows: list[dict[str, Any]]) -> float | None:
    """The share of the judged predictions an LLM decided (``None`` when none was judged)."""
    judged = [bool(r["judge_llm"]) for r in rows if "judge_llm" in r]
    return sum(judged) / len(judged) if judged else None


@task(retries=2, retry_delay_seconds=5)
def retrieval_metrics(
    questions: list[Question], collection: str, retriever_url: str, corpus: bool = False
) -> dict[str, float]:
    """Recall@K / Full-Recall@K / mAP of a hybrid search with each question as the query.

    A chunk counts as its paragraph (ids ``<doc id>#<n>``), at its best rank. ``corpus``: the
    collection is a corpus, its gold passages found by title and text (:func:`corpus_gold`).
    """
    graded = [q for q in questions if gold_ids(q)]
    if not graded:
        return {}
    queries = [q.question for q in graded]
    with RetrieverClient(retriever_url) as client:
        # in requests of SEARCH_BATCH: a search takes at most 256 queries (RETRIEVER_MAX_QUERIES)
        hits = [
            row
            for i in range(0, len(queries), SEARCH_BATCH)
            for row in client.search(collection, queries[i : i + SEARCH_BATCH], top_k=max(KS), mode="hybrid")
        ]
        golds = (
            gold_sets(corpus_gold(client, collection, graded)) if corpus else [gold_ids(q) for q in graded]
        )
    rankings = [list(dict.fromkeys(h.id.split("#")[0] for h in row)) for row in hits]
    report = retrieval_report(rankings, golds, KS)
    return {k: v for k, v in report.items() if k != "questions"}


def predictions(rows: list[dict[str, Any]], verdicts: list[bool]) -> list[Prediction]:
    return [
        Prediction(
            question_id=r["id"],
            prediction=r["prediction"] or "",
            refused=r["outcome"] == "refuse",
            em=r["em"],
            f1=r["f1"],
            judge_verdict=v,
            retrieval_count=r["retrievals"],
            latency=r["latency_s"],
        )
        for r, v in zip(rows, verdicts, strict=True)
    ]


def kind(question: Question) -> str:
    """The question's type in the report: ``unanswerable`` (no gold answer), ``comparison``,
    ``bridge`` (the synthetic world's ``bridge-N``, HotpotQA's ``bridge``), else its own type."""
    if not question.answerable:
        return "unanswerable"
    return (question.type or "other").split("-")[0]


def can_refuse(recipe: str) -> bool:
    """Whether the recipe has a refusal action (its grammar's closing turn offers ``<refuse/>``)."""
    return "<refuse/>" in grammar(recipe, turn=Turn(final=True)).lark


def breakdown(
    questions: list[Question], rows: list[dict[str, Any]], verdicts: list[bool], recipe: str
) -> dict[str, Any]:
    """Per question type: questions, EM, F1, judge, retrievals; and ``em_scored``, the EM of what
    the recipe can act on: a recipe without a refusal action is not charged for unanswerable
    questions (EM over the answerable ones); one with it scores a refusal of one as correct."""
    kinds = {q.id: kind(q) for q in questions}
    refusing = can_refuse(recipe)
    scored = [
        float(r["outcome"] == "refuse") if kinds[r["id"]] == "unanswerable" else r["em"]
        for r in rows
        if refusing or kinds[r["id"]] != "unanswerable"
    ]
    by_type: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(kinds[r["id"]] for r in rows):
        group = [(r, v) for r, v in zip(rows, verdicts, strict=True) if kinds[r["id"]] == name]
        by_type[name] = {
            "questions": float(len(group)),
            "em": sum(r["em"] for r, _ in group) / len(group),
            "f1": sum(r["f1"] for r, _ in group) / len(group),
            "judge": sum(v for _, v in group) / len(group),
            "refused": sum(r["outcome"] == "refuse" for r, _ in group) / len(group),
            "retrievals": sum(r["retrievals"] for r, _ in group) / len(group),
        }
    return {
        "by_type": by_type,
        "refusal_action": refusing,
        "em_scored": sum(scored) / len(scored) if scored else 0.0,
        "unanswerable_ids": [r["id"] for r in rows if kinds[r["id"]] == "unanswerable"],
    }


@flow(name="evaluate")
def evaluate(
    run_id: str,
    label: str,
    questions_path: str,
    collection: str,
    recipe: str,
    policy_url: str,
    retriever_url: str,
    judge_url: str,
    dataset: str = "",
    limit: int | None = None,
    checkpoint_id: int | None = None,
    repeatable: bool = False,
    protocol: str | None = None,
    shape: EpisodeShape | None = None,
    recipe_config: dict[str, Any] | None = None,
    corpus: bool = False,
    concurrency: int = 4,
) -> dict[str, Any]:
    """Evaluate the policy as served now on ``questions_path[:limit]`` and publish the run's report.

    Args:
        label: the evaluation's name in the report; ``baseline`` is the reference of the p-values.
        dataset: the dataset's name in the report (default: the file's stem).
        checkpoint_id: the registry id of the checkpoint being served, if any.
        repeatable: answer through ``/v1/answer/batch`` (greedy lock-step rounds: the same
            answers on every run) instead of one ``/v1/answer`` request per question.
        protocol: a recipe of :data:`hoprl.protocols.PROTOCOLS`: answer in its paper's episode
            and decoding, with its generation step; the report prints the paper's figures beside ours.
        shape: without a protocol, the episode every answer runs (a pipeline's: its run's shape,
            greedy); unset: the service's. The report states the episode each evaluation ran.
        recipe_config: without a protocol, the recipe's options every answer runs with (a
            pipeline's: the config its jobs train with, so the model is asked as it was trained).
        corpus: ``collection`` is a corpus (the open-domain setting): gold paragraphs are found in
            it by title and text.
        concurrency: ``/v1/answer`` requests in flight (the policy batches them; its
            ``POLICY_MAX_BATCH``, 16 by default, is the most it runs at once).

    Returns ``{"evaluation_id", "metrics", "report"}`` (``report``: the report's path).
    """
    split = Path(questions_path).stem
    out = run_dir(run_id) / "evals" / f"{label.replace('/', '-')}.json"
    questions = load_questions(questions_path, limit)  # read once; every metric scores these
    summary = answer_questions(
        questions,
        recipe,
        collection,
        policy_url,
        retriever_url,
        str(out),
        repeatable,
        protocol,
        shape,
        recipe_config,
        corpus,
        concurrency,
        label,
    )
    verdicts = judge_answers(str(out), questions, judge_url)
    retrieval = retrieval_metrics(questions, collection, retriever_url, corpus)
    rows = json.loads(out.read_text())
    metrics = {
        **summary,
        **retrieval,
        "judge_accuracy": sum(verdicts) / max(1, len(verdicts)),
        "judge_llm_share": judge_llm_share(rows),
        **ended_shares([r["outcome"] for r in rows]),
        **breakdown(questions, rows, verdicts, recipe),
        "label": label,
        "recipe": recipe,
        "collection": collection,
        "corpus": corpus,
        "repeatable": repeatable,
        "protocol": protocol,
    }
    evaluation_id = registry().add_evaluation(
        run_id, dataset or split, split, metrics, predictions(rows, verdicts), checkpoint=checkpoint_id
    )
    get_run_logger().info(
        # the EM the report heads with (what the recipe can act on), then EM over every question
        "evaluation %d (%s, %s): EM %.3f (%s; %.3f over all %d), F1 %.3f, judge %.3f, %.2f retrievals, "
        "cut by token budget %.2f / format error %.2f",
        evaluation_id,
        label,
        recipe,
        metrics["em_scored"],
        "refusals scored" if metrics["refusal_action"] else "answerable questions",
        metrics["em"],
        len(rows),
        metrics["f1"],
        metrics["judge_accuracy"],
        metrics["retrieval_count"],
        metrics["ended/token_budget"],
        metrics["ended/format_error"],
    )
    report = publish_report(run_id)
    return {"evaluation_id": evaluation_id, "metrics": metrics, "report": report}


def evaluate_protocol(
    run_id: str,
    protocol: str,
    policy_url: str,
    retriever_url: str,
    judge_url: str,
    data_dir: str = "../shared/data",
    limit: int | None = None,
    checkpoint_id: int | None = None,
    seed: int = 0,
    corpus: str | None = None,
) -> dict[str, Any]:
    """The paper's evaluation of the policy as served now: every set of ``protocol`` found in
    ``data_dir``, its paper's sample (written to ``<run folder>/protocol/``) indexed as its own
    corpus, or searched in the ``corpus`` collection when one is named (the open-domain setting),
    ``limit`` questions each, labelled ``final/<dataset>``. Sets not on disk are logged
    and skipped (``hoprl eval-answers --protocol --from-hub`` loads them where the hub is reachable),
    and so, without a corpus, are sets whose questions carry no paragraphs.

    Returns ``{dataset: evaluate()'s result}`` for the sets evaluated.
    """
    log, out, paper = get_run_logger(), {}, get_protocol(protocol)
    for evalset in paper.sets:
        path = local_file(evalset, data_dir)
        if path is None:
            log.info("protocol %s: %s (%s) is not in %s, skipped", protocol, evalset.dataset, evalset.split,
                     data_dir)  # fmt: skip
            continue
        chosen = sample(load_questions(path), evalset, seed)
        if corpus is None and not any(q.paragraphs for q in chosen):
            log.warning("protocol %s: %s carries no paragraphs and needs a corpus (the paper: %s); "
                        "skipped: name one (corpus=...)",
                        protocol, evalset.dataset, paper.setting(evalset))  # fmt: skip
            continue
        where = f"the corpus {corpus}" if corpus else "its own paragraphs"
        log.info("protocol %s: %s from %s; the paper: %s", protocol, evalset.dataset, where,
                 paper.setting(evalset))  # fmt: skip
        chosen_path = run_dir(run_id) / "protocol" / f"{evalset.dataset}_{evalset.split}.jsonl"
        write_questions(chosen_path, chosen)
        collection = corpus or prepare_collection(retriever_url, chosen)
        label, recipe = f"final/{evalset.dataset}", paper.recipe
        out[evalset.dataset] = evaluate(
            run_id, label, str(chosen_path), collection, recipe, policy_url, retriever_url, judge_url,
            dataset=evalset.dataset, limit=limit, checkpoint_id=checkpoint_id, protocol=protocol,
            corpus=corpus is not None,
        )  # fmt: skip
    return out
