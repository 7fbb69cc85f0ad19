"""The run report as the Prefect UI shows it: narrow tables, and a plot whose labels never overlap.

No services: a SQLite registry in a temp folder holds the evaluations the report reads back.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from flows.report import accuracy_figure, markdown_table
from flows.runs import registry
from hoprl.domain import Question
from hoprl.registry import Prediction
from hoprl.registry.store import Registry

# (label, recipe, per-question EM): three evaluations on the same point (EM 0, 1 retrieval)
EVALUATIONS = [
    ("baseline", "when-to-search", [0, 0, 0, 0]),
    ("baseline/naive-rag", "naive-rag", [0, 0, 0, 0]),
    ("baseline/search-r1", "search-r1", [0, 0, 0, 0]),
    ("final", "when-to-search", [1, 1, 0, 1]),
]


@pytest.fixture
def run_id(local_registry: Registry) -> Iterator[str]:
    reg = local_registry
    reg.create_run("report-run", "when-to-search", "grpo", "tiny", {}, 0)
    for label, recipe, ems in EVALUATIONS:
        metrics = {
            "label": label, "recipe": recipe, "questions": len(ems), "em": sum(ems) / len(ems),
            "f1": sum(ems) / len(ems), "judge_accuracy": 0.5, "retrieval_count": 1.0,
            "recall@2": 0.25, "recall@5": 0.5, "full_recall@5": 0.25, "map@10": 0.3125,
            "latency_p50_s": 1.234, "latency_p99_s": 2.5, "retrieval_s": 0.05, "generation_s": 1.125,
            "agent_k": 2.5, "agent_recall": 0.75, "agent_full_recall": 0.5, "agent_map": 0.625,
            "judge_llm_share": 0.5 if label == "final" else 1.0,
        }  # fmt: skip
        if label == "final":  # what evaluate() stores: the episode that ran and the limits applied
            metrics["episode"] = {"max_steps": 4, "max_new_tokens_per_step": 96, "token_budget": 1152,
                                  "top_k": 5, "temperature": 0.0, "stop": None, "search_mode": "hybrid",
                                  "grammar": False}  # fmt: skip
            metrics["limited"] = ["token_budget 1152 -> 1024 (POLICY_TOKEN_BUDGET)"]
        predictions = [
            Prediction(question_id=f"q{i}", prediction="x", refused=False, em=em, f1=em,
                       judge_verdict=bool(em), retrieval_count=1, latency=1.0)
            for i, em in enumerate(ems)
        ]  # fmt: skip
        reg.add_evaluation("report-run", "synthetic", "test", metrics, predictions)
    yield "report-run"


def test_report_tables_are_narrow(run_id: str) -> None:
    """Every table has at most 6 columns and no cell over 24 characters (one 12-column table with
    a 30-character last cell was cut off in the Prefect UI)."""
    text = markdown_table(run_id)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert max(len(c) for c in cells) <= 6
    assert max(len(v) for c in cells for v in c) <= 24
    # Nothing was dropped: every evaluation and every metric is still in the report.
    for label, _, _ in EVALUATIONS:
        # answers, how episodes ended, by type, EM vs baseline, agent, index, time
        assert sum(c[0] == label for c in cells) == 7
    assert "| final | when-to-search | - | 0.750 | 0.500 | 1.000 |" in text  # stored before em_scored
    assert "| final | 2.500 | 0.750 | 0.500 | 0.625 |" in text  # the agent's retrieval at its K
    assert "| final | 0.250 | 0.500 | 0.250 | 0.312 |" in text  # the index's
    assert "| final | 1.234 | 2.500 | 0.050 | 1.125 |" in text
    # final vs baseline: EM 0.75 vs 0 on the same 4 questions, a difference of +0.750
    (final,) = [c for c in cells if c[0] == "final" and c[1].startswith("+")]
    assert final[1] == "+0.750" and final[2].startswith("[")
    assert (
        "- `final`: 4 steps x 96 tokens within 1152, greedy, free of the grammar, 5 documents a search; "
        "the service's limits lowered token_budget 1152 -> 1024 (POLICY_TOKEN_BUDGET)"
    ) in text
    assert "- `baseline`: episode not recorded; the service's limits lowered nothing" in text
    # half of final's judge verdicts came from the rules: one warning, for final only
    assert text.count("**Warning:**") == 1 and "`final`: 50% of the judge column's verdicts" in text


def test_report_flags_rules_verdicts_where_the_paper_used_an_llm(run_id: str) -> None:
    """A segment's judge counts (copied to the run as ``train/judge/*``) put a warning in the report."""
    assert "## Judge" not in markdown_table(run_id)
    counts = {"judge/llm_expected": 1.0, "judge/service_bound": 1.0, "judge/calls": 8.0,
              "judge/llm_calls": 5.0, "judge/fallbacks": 3.0}  # fmt: skip
    registry().log_metrics(run_id, 4, {f"train/{k}": v for k, v in counts.items()})
    text = markdown_table(run_id)
    assert "## Judge" in text and "3 of 8 verdicts came from the rules judge" in text


#: (label, recipe, per-question EM) on q0-q3 (bridge-2, bridge-3, comparison, comparison) and q4
#: (unanswerable); no recipe here has a refusal action
SCORED = [
    ("baseline", "when-to-search", [0, 0, 0, 0, 0]),
    ("baseline/naive-rag", "naive-rag", [0, 0, 1, 0, 0]),
    ("sft", "when-to-search", [1, 0, 0, 0, 0]),
    ("final", "when-to-search", [1, 1, 0, 1, 0]),
]


def test_the_report_scores_what_the_recipe_can_act_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Untrained, naive-rag, SFT and RL rows; EM leaves the unanswerable question out for recipes
    without a refusal action (final: 3 of the 4 answerable = 0.750; over all 5: 0.600); per type,
    final's bridge EM is 2/2 = 1.000 and comparison 1/2 = 0.500; the bootstraps pair the 4
    answerable questions: final - baseline = 0.75 - 0 = +0.750, final - sft = 0.75 - 0.25 = +0.500."""
    from flows.evaluate import breakdown

    monkeypatch.setenv("HOPRL_DATABASE_URL", f"sqlite:///{tmp_path / 'registry.db'}")
    monkeypatch.setenv("HOPRL_RUNS_DIR", str(tmp_path / "runs"))
    types = ["bridge-2", "bridge-3", "comparison", "comparison", "bridge-2"]
    questions = [
        Question(
            id=f"q{i}",
            dataset="synthetic",
            split="test",
            question="?",
            type=t,
            answers=["a"] if i < 4 else [],
        )
        for i, t in enumerate(types)
    ]
    reg = registry()
    reg.create_run("scored", "when-to-search", "dapo", "tiny", {}, 0)
    for label, recipe, ems in SCORED:
        rows = [{"id": f"q{i}", "em": float(em), "f1": float(em), "retrievals": 1, "outcome": "answer"}
                for i, em in enumerate(ems)]  # fmt: skip
        verdicts = [bool(em) for em in ems]
        metrics = {"label": label, "recipe": recipe, "questions": 5, "em": sum(ems) / 5,
                   **breakdown(questions, rows, verdicts, recipe)}  # fmt: skip
        predictions = [
            Prediction(question_id=r["id"], prediction="x", refused=False, em=r["em"], f1=r["f1"],
                       judge_verdict=v, retrieval_count=1, latency=1.0)
            for r, v in zip(rows, verdicts, strict=True)
        ]  # fmt: skip
        reg.add_evaluation("scored", "synthetic", "test", metrics, predictions)
    text = markdown_table("scored")
    assert "| final | when-to-search | 0.750 | - | - | - |" in text
    assert "| sft | when-to-search | 0.250 | - | - | - |" in text
    assert "| final | 1.000 (2) | 0.500 (2) | 0.000 (1) | 0.600 |" in text
    assert "1 of the questions have no answer" in text
    rows = [line for line in text.splitlines() if line.startswith("| final | +")]
    assert [r.split(" | ")[1] for r in rows] == ["+0.750", "+0.500"]  # against baseline, then sft


def test_accuracy_plot_labels_never_overlap() -> None:
    """Three evaluations on one point and one apart: every name is drawn once, inside the
    figure, and no two names overlap (labels written at the points covered each other)."""
    points = [(f"{label} ({recipe})", 1.0, sum(ems) / len(ems)) for label, recipe, ems in EVALUATIONS]
    fig = accuracy_figure("report-run: accuracy vs retrieval count", points)
    try:
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        fig.draw(renderer)
        names = {name for name, _, _ in points}
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() in names]
        assert sorted(t.get_text() for t in texts) == sorted(names)
        boxes = [t.get_window_extent(renderer) for t in texts]
        figure = fig.bbox
        assert all(figure.x0 <= b.x0 and b.x1 <= figure.x1 and figure.y0 <= b.y0 and b.y1 <= figure.y1
                   for b in boxes)  # fmt: skip
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), "two evaluation names overlap"
    finally:
        plt.close(fig)


def test_paper_figures_beside_ours_only_for_the_papers_backbone() -> None:
    """ARENA's Table 3: ARENA-Qwen-7B (Qwen2.5-7B-Instruct) EM 0.628 on HotpotQA. A run serving that
    backbone with EM 0.5 shows 0.5 - 0.628 = -0.128; a run serving another model shows the paper's
    figure labelled as the paper's model, with no difference."""
    from flows.report import paper_section
    from hoprl.registry.models import EvaluationRow

    def row(model: str) -> EvaluationRow:
        metrics = {"label": "final/hotpotqa", "protocol": "arena", "model": model, "em": 0.5, "f1": 0.6}
        return EvaluationRow(dataset="hotpotqa", split="dev", metrics=metrics)

    same = [line for line in paper_section([row("qwen2.5-7b-instruct-step40")]) if "| em |" in line]
    assert any("| 0.628 | -0.128 | Qwen/Qwen2.5-7B-Instruct | Table 3 |" in line for line in same), same
    other = [line for line in paper_section([row("smollm2-135m-instruct")]) if "| em |" in line]
    assert other and all("| - |" in line and "the paper's; this run serves smollm2" in line for line in other)
    assert paper_section([EvaluationRow(dataset="hotpotqa", split="dev", metrics={"em": 0.5})]) == []
