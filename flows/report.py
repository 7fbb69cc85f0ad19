"""A run's report: a markdown table and PNG plots, in the run folder and as Prefect artifacts.

Everything is read back from the registry, so the report can be rebuilt at any time (each
evaluation and each training segment publishes it again):

- ``report.md``: one table per dataset with every evaluation of the run (EM, F1, judge accuracy,
  retrieval count, Recall / Full-Recall / mAP, latency) and, for each, the paired bootstrap
  (10,000 resamples) of its EM against the evaluation labelled ``baseline``;
- ``training.png``: the training reward per step and the dev EM at each segment's check, with the
  curriculum's stage switches as vertical lines;
- ``accuracy_vs_retrievals.png``: EM against the mean retrieval count, one point per evaluation
  (recipe and label), the trade-off the when-to-search recipe is about.

In the Prefect UI the same report is the markdown artifact ``<run>-report`` and the plots are
markdown artifacts with the PNG embedded (``<run>-training``, ``<run>-accuracy``).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and workers

import matplotlib.pyplot as plt
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from sqlalchemy import select

from flows.runs import registry, run_dir
from hoprl.registry.models import EvaluationRow

COLUMNS = [
    ("em", "EM"),
    ("f1", "F1"),
    ("judge_accuracy", "judge"),
    ("retrieval_count", "retrievals"),
    ("recall@2", "R@2"),
    ("recall@5", "R@5"),
    ("full_recall@5", "FullR@5"),
    ("map@10", "mAP@10"),
    ("latency_p50_s", "p50 s"),
]


def evaluations(run_id: str) -> list[EvaluationRow]:
    """The run's evaluations, oldest first."""
    query = select(EvaluationRow).filter_by(run_id=run_id).order_by(EvaluationRow.id)
    with registry().session() as s:
        return list(s.scalars(query))


def cell(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value if value is not None else "-")


def versus(row: EvaluationRow, baseline: EvaluationRow | None) -> str:
    """``+0.120 [0.04, 0.20] p=0.003`` (EM difference against the baseline), or ``-``."""
    if baseline is None or row.id == baseline.id:
        return "-"
    try:
        result = registry().compare(row.id, baseline.id, "em")
    except ValueError:  # no shared questions
        return "-"
    return f"{result.diff:+.3f} [{result.ci_low:.2f}, {result.ci_high:.2f}] p={result.p_value:.3g}"


def markdown_table(run_id: str) -> str:
    """The report's markdown: one table per dataset, every evaluation against the baseline."""
    rows = evaluations(run_id)
    lines = [f"# hoprl run `{run_id}`", ""]
    for dataset in dict.fromkeys(r.dataset for r in rows):
        group = [r for r in rows if r.dataset == dataset]
        baseline = next((r for r in group if r.metrics.get("label") == "baseline"), None)
        lines += [
            f"## {dataset} ({group[0].split}, {group[0].metrics.get('questions', '?')} questions)",
            "",
            "| evaluation | recipe | " + " | ".join(h for _, h in COLUMNS) + " | EM vs baseline |",
            "|---|---|" + "---:|" * (len(COLUMNS) + 1),
        ]
        for r in group:
            name, recipe = r.metrics.get("label", r.id), r.metrics.get("recipe", "")
            values = " | ".join(cell(r.metrics.get(k)) for k, _ in COLUMNS)
            lines.append(f"| {name} | {recipe} | {values} | {versus(r, baseline)} |")
        lines.append("")
    switches = registry().stage_switches(run_id)
    if switches:
        lines += ["## Curriculum", ""] + [
            f"- step {s.step}: {s.from_stage} -> {s.to_stage} "
            f"({s.reason}; {s.metric_name}={cell(s.metric_value)})"
            for s in switches
        ]
    return "\n".join(lines) + "\n"


def training_plot(run_id: str, path: Path) -> Path | None:
    """Reward per training step and dev EM per check, stage switches as dashed vertical lines."""
    reward = registry().metric_series(run_id, "train/reward")
    dev_em = registry().metric_series(run_id, "dev/em")
    if not reward and not dev_em:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    if reward:
        top.plot(*zip(*reward, strict=True), color="tab:blue", linewidth=1)
    top.set_ylabel("training reward")
    if dev_em:
        bottom.plot(*zip(*dev_em, strict=True), marker="o", color="tab:green")
    bottom.set_ylabel("dev EM")
    bottom.set_xlabel("step")
    for s in registry().stage_switches(run_id):
        for ax in (top, bottom):
            ax.axvline(s.step, color="tab:red", linestyle="--", linewidth=1)
        top.annotate(
            f"{s.to_stage}",
            (s.step, 1),
            xycoords=("data", "axes fraction"),
            color="tab:red",
            ha="left",
            va="top",
            fontsize=8,
        )
    fig.suptitle(f"{run_id}: training")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def accuracy_plot(run_id: str, path: Path) -> Path | None:
    """EM against mean retrieval count, one labelled point per evaluation."""
    rows = evaluations(run_id)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in rows:
        x, y = r.metrics.get("retrieval_count", 0.0), r.metrics.get("em", 0.0)
        ax.scatter([x], [y])
        ax.annotate(
            f"{r.metrics.get('label')} ({r.metrics.get('recipe')})",
            (x, y),
            fontsize=8,
            textcoords="offset points",
            xytext=(4, 4),
        )
    ax.set_xlabel("retrievals per question")
    ax.set_ylabel("EM")
    ax.set_title(f"{run_id}: accuracy vs retrieval count")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def artifact_key(run_id: str, name: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{name}".lower())


def embedded(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"![{path.name}](data:image/png;base64,{data})\n\n`{path}`\n"


@task
def publish_report(run_id: str) -> str:
    """Write ``report.md`` and the plots to the run folder, publish them as artifacts.

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
    if FlowRunContext.get() is not None:
        create_markdown_artifact(text, key=artifact_key(run_id, "report"), description=f"report of {run_id}")
        for p in plots:
            create_markdown_artifact(
                embedded(p),
                key=artifact_key(run_id, p.stem.split("_")[0]),
                description=f"{p.stem} of {run_id}",
            )
    return str(report)
