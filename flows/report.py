"""A run's report: a markdown table and PNG plots, in the run folder and as Prefect artifacts.

Everything is read back from the registry, so the report can be rebuilt at any time (each
evaluation and each training segment publishes it again):

- ``report.md``: per dataset, narrow tables with every evaluation of the run: answers (EM as the
  recipe can act on it, EM over all questions, F1, judge accuracy, retrieval count), how the
  episodes ended (the shares that answered or were cut by the token budget, a format error, the
  step cap), EM per question
  type (bridge, comparison; the refused share of unanswerable ones), the paired bootstrap (10,000
  resamples) of each EM against the untrained model (``baseline``) and against the SFT warm start
  (``sft``) (difference, 95% interval, p), the agent's own retrieval
  (Recall / Full-Recall / mAP of its episodes' documents at their mean K), the index's retrieval
  with the question as the query (Recall@K / Full-Recall@K / mAP), and seconds per question
  (p50 / p99 latency, T_r / T_g). Few short columns each, so the Prefect UI's markdown view
  shows every column (one wide table had its last column cut off there);
- ``## Training`` in ``report.md`` and ``training.png``: the SFT loss per step, the warm start's
  pass@1 / pass@k before RL, and each RL step's signals (reward and its spread, flat groups,
  clipping, KL to the warm start, how the episodes ended, dev checks): :mod:`flows.training_report`;
- ``accuracy_vs_retrievals.png``: EM against the mean retrieval count, one point per evaluation
  (recipe and label), the trade-off the when-to-search recipe is about. Each evaluation has its
  own marker and colour, named in a legend beside the axes: evaluations often land on the same
  point (two untrained recipes at EM 0), where labels written next to the points overlapped.

In the Prefect UI the same report is the markdown artifact ``<run>-report`` and the plots are
markdown artifacts with the PNG embedded (``<run>-training``, ``<run>-accuracy``). They belong to
the **pipeline's** flow run (the one the registry run is linked to, see
:func:`flows.runs.link_flow_run`), whichever subflow publishes them, so its Artifacts tab holds
them; each publication updates them in place (one card each, always the latest numbers). Outside
a pipeline (an ``evaluate`` flow on its own) they belong to the current flow run.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any
from uuid import UUID

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and workers

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from prefect import task
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from sqlalchemy import select

from flows.runs import registry, run_dir
from flows.training_report import training_plot, training_section
from hoprl.judging import judge_flag
from hoprl.metrics.stats import paired_bootstrap
from hoprl.protocols import METRIC_KEYS, headlines, served_backbone
from hoprl.registry.models import EvaluationRow

# The report's tables: (metric key, column header); each table stays a few short columns wide.
# EM is what the recipe can act on (``em_scored``, flows.evaluate.breakdown); "EM all" charges
# every question, the unanswerable ones included (beside EM per question type)
ANSWER_COLUMNS = [
    ("em_scored", "EM"),
    ("f1", "F1"),
    ("judge_accuracy", "judge"),
    ("retrieval_count", "retrievals"),
]
# How the episodes ended: the shares that answered, or were cut by the token budget, a format error
# or the step cap
ENDED_COLUMNS = [("ended/answer", "answer"), ("ended/token_budget", "token budget"),
                 ("ended/format_error", "format error"), ("ended/step_cap", "step cap")]  # fmt: skip
# The references of the paired bootstraps: the untrained model and the SFT warm start
REFERENCES = ("baseline", "sft")
KINDS = ("bridge", "comparison", "unanswerable")
# What the episodes themselves retrieved, at their own K (R2AG's Recall / Full-Recall / mAP with K)
AGENT_COLUMNS = [
    ("agent_k", "K"),
    ("agent_recall", "R@K"),
    ("agent_full_recall", "FullR@K"),
    ("agent_map", "mAP@K"),
]
# The index alone: a hybrid search with the question as the query
RETRIEVAL_COLUMNS = [
    ("recall@2", "R@2"),
    ("recall@5", "R@5"),
    ("full_recall@5", "FullR@5"),
    ("map@10", "mAP@10"),
]
# Seconds per question: latency percentiles, and the time spent retrieving (T_r) and generating (T_g)
TIME_COLUMNS = [
    ("latency_p50_s", "p50 s"),
    ("latency_p99_s", "p99 s"),
    ("retrieval_s", "T_r s"),
    ("generation_s", "T_g s"),
]


def evaluations(run_id: str) -> list[EvaluationRow]:
    """The run's evaluations, oldest first."""
    query = select(EvaluationRow).filter_by(run_id=run_id).order_by(EvaluationRow.id)
    with registry().session() as s:
        return list(s.scalars(query))


def cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value if value is not None else "-")


def episode_cell(episode: dict[str, Any] | None) -> str:
    """An evaluation's episode shape in words: steps x tokens within the budget, decoding, grammar."""
    if not episode:
        return "episode not recorded"
    decoding = "greedy" if episode["temperature"] == 0 else f"temperature {episode['temperature']:g}"
    grammar = "under the action grammar" if episode["grammar"] else "free of the grammar"
    docs = f", {episode['top_k']} documents a search" if episode.get("top_k") else ""
    return (f"{episode['max_steps']} steps x {episode['max_new_tokens_per_step']} tokens within "
            f"{episode['token_budget']}, {decoding}, {grammar}{docs}")  # fmt: skip


def scored_em(row: EvaluationRow) -> dict[str, float]:
    """Per question, the EM the recipe is scored on (flows.evaluate.breakdown): unanswerable
    questions are left out for a recipe without a refusal action, and count as correct when
    refused for one with it. An evaluation stored before the breakdown scores every question."""
    unanswerable = set(row.metrics.get("unanswerable_ids", []))
    refusing = bool(row.metrics.get("refusal_action", False))
    return {
        p.question_id: (float(p.refused) if p.question_id in unanswerable else p.em)
        for p in registry().predictions(row.id)
        if refusing or p.question_id not in unanswerable
    }


def versus(row: EvaluationRow, reference: EvaluationRow | None) -> list[str]:
    """``["+0.120", "[0.04, 0.20]", "0.003"]``: the scored EM's difference against ``reference``
    over the questions both are scored on, its 95% interval and p-value (paired bootstrap,
    10,000 resamples), or dashes."""
    if reference is None or row.id == reference.id:
        return ["-", "-", "-"]
    a, b = scored_em(row), scored_em(reference)
    shared = sorted(a.keys() & b.keys())
    if not shared:
        return ["-", "-", "-"]
    result = paired_bootstrap([a[q] for q in shared], [b[q] for q in shared], n_resamples=10_000, seed=0)
    return [f"{result.diff:+.3f}", f"[{result.ci_low:.2f}, {result.ci_high:.2f}]", f"{result.p_value:.3g}"]


def kind_cells(row: EvaluationRow) -> list[str]:
    """EM per question type (``n`` questions), and the refused share of the unanswerable ones."""
    by_type = row.metrics.get("by_type", {})
    cells = []
    for name in KINDS:
        part = by_type.get(name)
        value = None if part is None else part["refused" if name == "unanswerable" else "em"]
        cells.append("-" if part is None else f"{value:.3f} ({int(part['questions'])})")
    return cells


def table(headers: list[str], rows: list[list[str]], names: int = 1) -> list[str]:
    """A markdown table: the first ``names`` columns left-aligned, the others (numbers) right-aligned."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * names + "---:|" * (len(headers) - names)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def paper_section(group: list[EvaluationRow]) -> list[str]:
    """The paper's figures for the evaluations run under a paper's protocol (``hoprl pipeline
    --protocol``): beside ours, with the difference, when the served model is the paper's backbone;
    otherwise labelled as the paper's model's result."""
    rows = []
    for r in group:
        protocol, model = r.metrics.get("protocol"), str(r.metrics.get("model") or "")
        for h in headlines(protocol, r.dataset) if protocol else []:
            ours = r.metrics.get(METRIC_KEYS[h.metric])
            same = served_backbone(model, h.model) and isinstance(ours, float | int)
            diff = f"{float(ours) * h.scale - h.value:+.3g}" if same and ours is not None else "-"
            label = h.model if same else f"{h.model} (the paper's; this run serves {model or '?'})"
            rows.append([str(r.metrics.get("label")), h.metric, h.printed, diff, label, h.source])
    if not rows:
        return []
    head = ["evaluation", "metric", "paper", "ours - paper", "paper's model", "source"]
    return ["### The paper's figures (hoprl/protocols.py)", "", *table(head, rows, names=2)]


def markdown_table(run_id: str) -> str:
    """The report's markdown: per dataset, the answers, EM against the baseline, and retrieval."""
    rows = evaluations(run_id)
    lines = [f"# hoprl run `{run_id}`", ""]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        group = [r for r in rows if r.dataset == dataset]
        names = [str(r.metrics.get("label", r.id)) for r in group]
        answers = [
            [name, str(r.metrics.get("recipe", ""))] + [cell(r.metrics.get(k)) for k, _ in ANSWER_COLUMNS]
            for name, r in zip(names, group, strict=True)
        ]
        agent, retrieval, times = (
            [
                [name] + [cell(r.metrics.get(k)) for k, _ in columns]
                for name, r in zip(names, group, strict=True)
            ]
            for columns in (AGENT_COLUMNS, RETRIEVAL_COLUMNS, TIME_COLUMNS)
        )
        lines += [f"## {dataset} ({group[0].split}, {group[0].metrics.get('questions', '?')} questions)", ""]
        unanswerable = max((len(r.metrics.get("unanswerable_ids", [])) for r in group), default=0)
        lines += ["### Answers", ""]
        lines += table(["evaluation", "recipe"] + [h for _, h in ANSWER_COLUMNS], answers, names=2)
        lines += [
            f"EM scores what the recipe can act on: {unanswerable} of the questions have no answer; a "
            "recipe without a refusal action (all but evo-rag) is not charged for them (EM over the "
            "answerable ones), one with it scores a refusal of them as correct. EM all charges every "
            "question.",
            "",
        ]
        lines += [
            f"**Warning:** `{name}`: {1 - share:.0%} of the judge column's verdicts came from the rules "
            "judge, not an LLM (the papers judge with an LLM).\n"
            for name, r in zip(names, group, strict=True)
            if (share := r.metrics.get("judge_llm_share")) is not None and share < 1
        ]
        lines += paper_section(group)
        lines += ["### How the episodes ended (share of the episodes)", ""]
        lines += table(
            ["evaluation"] + [h for _, h in ENDED_COLUMNS],
            [
                [name] + [cell(r.metrics.get(k)) for k, _ in ENDED_COLUMNS]
                for name, r in zip(names, group, strict=True)
            ],
        )
        lines += ["### The episode each evaluation ran (after the service's limits)", ""]
        lines += [
            f"- `{name}`: {episode_cell(r.metrics.get('episode'))}; the service's limits lowered "
            + ("; ".join(r.metrics.get("limited") or []) or "nothing")
            for name, r in zip(names, group, strict=True)
        ] + [""]
        lines += ["### By question type (EM; unanswerable: share refused; questions in brackets)", ""]
        lines += table(
            ["evaluation", *KINDS, "EM all"],
            [[name, *kind_cells(r), cell(r.metrics.get("em"))] for name, r in zip(names, group, strict=True)],
        )
        for label in REFERENCES:
            reference = next((r for r in group if r.metrics.get("label") == label), None)
            if reference is None:
                continue
            lines += [f"### EM against `{label}` (paired bootstrap, 10,000 resamples)", ""]
            lines += table(
                ["evaluation", "EM diff", "95% CI", "p"],
                [[name, *versus(r, reference)] for name, r in zip(names, group, strict=True)],
            )
        lines += ["### The agent's retrieval (the documents its episodes retrieved, at their K)", ""]
        lines += table(["evaluation"] + [h for _, h in AGENT_COLUMNS], agent)
        lines += ["### The index's retrieval (the question as the query)", ""]
        lines += table(["evaluation"] + [h for _, h in RETRIEVAL_COLUMNS], retrieval)
        lines += ["### Seconds per question", ""]
        lines += table(["evaluation"] + [h for _, h in TIME_COLUMNS], times)
    lines += training_section(run_id, table)
    flag = judge_flag(registry().latest_metrics(run_id), prefix="train/")
    if flag:
        lines += ["## Judge", "", f"**Warning:** {flag}.", ""]
    switches = registry().stage_switches(run_id)
    if switches:
        lines += ["## Curriculum", ""] + [
            f"- step {s.step}: {s.from_stage} -> {s.to_stage} "
            f"({s.reason}; {s.metric_name}={cell(s.metric_value)})"
            for s in switches
        ]
    return "\n".join(lines) + "\n"


MARKERS = "osD^vP*Xph<>"


def accuracy_figure(title: str, points: list[tuple[str, float, float]]) -> Figure:
    """EM against retrievals per question; ``points`` are (name, retrievals, EM), one per evaluation.

    Each point has its own marker and colour and is named in a legend beside the axes, never by
    a label at the point: points often coincide. The markers are hollow and shrink with each
    evaluation, so coinciding points stay visible as nested rings.
    """
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for i, (name, x, y) in enumerate(points):
        ax.scatter(
            [x],
            [y],
            marker=MARKERS[i % len(MARKERS)],
            s=max(25.0, 320.0 * 0.55**i),
            facecolors="none",
            edgecolors=f"C{i % 10}",
            linewidths=1.5,
            label=name,
        )
    ax.set_xlabel("retrievals per question")
    ax.set_ylabel("EM")
    ax.set_title(title)
    ax.margins(0.15)
    legend = fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    for handle in legend.legend_handles:  # one marker size in the legend, whatever the point's
        handle.set_sizes([50.0])  # type: ignore[union-attr]
    return fig


def accuracy_plot(run_id: str, path: Path) -> Path | None:
    """EM against mean retrieval count, one point per evaluation (see :func:`accuracy_figure`)."""
    rows = evaluations(run_id)
    if not rows:
        return None
    points = [
        (
            f"{r.metrics.get('label')} ({r.metrics.get('recipe')})",
            float(r.metrics.get("retrieval_count", 0.0)),
            float(r.metrics.get("em", 0.0)),
        )
        for r in rows
    ]
    fig = accuracy_figure(f"{run_id}: accuracy vs retrieval count", points)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def artifact_key(run_id: str, name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{name}".lower())


def embedded(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"![{path.name}](data:image/png;base64,{data})\n\n`{path}`\n"


def artifact_flow_run(run_id: str) -> UUID | None:
    """The flow run the run's artifacts belong to: the pipeline's (the registry's link), else the
    current flow run (an ``evaluate`` on its own), else None (not in a flow run)."""
    run = registry().get_run(run_id)
    linked = run.prefect_flow_run_id if run is not None else None
    current = flow_run.get_id()
    return UUID(linked or current) if (linked or current) else None


def put_markdown(
    client: SyncPrefectClient, flow_run_id: UUID, key: str, markdown: str, description: str
) -> None:
    """Create the markdown artifact ``key`` on the flow run, or update the one already there."""
    artifact_filter = ArtifactFilter(
        key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
    )
    existing = client.read_artifacts(artifact_filter=artifact_filter, limit=1)
    if existing:
        client.update_artifact(existing[0].id, ArtifactUpdate(data=markdown, description=description))
    else:
        client.create_artifact(
            ArtifactCreate(
                key=key, type="markdown", data=markdown, description=description, flow_run_id=flow_run_id
            )
        )


@task
def publish_report(run_id: str) -> str:
    """Write ``report.md`` and the plots to the run folder, publish them as artifacts of the
    pipeline's flow run (see the module docstring).

    Returns the report's path.
    """
    folder = run_dir(run_id)
    text = markdown_table(run_id)
    plots = [
        p
        for p in (
            training_plot(run_id, folder / "training.png"),
            accuracy_plot(run_id, folder / "accuracy_vs_retrievals.png"),
        )
        if p
    ]
    report = folder / "report.md"
    report.write_text(text + "".join(f"\n![{p.stem}]({p.name})\n" for p in plots))
    owner = artifact_flow_run(run_id) if FlowRunContext.get() is not None else None
    if owner is not None:
        with get_client(sync_client=True) as client:
            put_markdown(client, owner, artifact_key(run_id, "report"), text, f"report of {run_id}")
            for p in plots:
                key = artifact_key(run_id, p.stem.split("_")[0])
                put_markdown(client, owner, key, embedded(p), f"{p.stem} of {run_id}")
    return str(report)
