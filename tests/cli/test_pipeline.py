"""What ``hoprl pipeline`` prints at the end of a run."""

from __future__ import annotations

from cli.pipeline import format_summary


def test_the_summary_heads_with_the_em_the_report_scores_then_em_over_all() -> None:
    """A when-to-search run on 20 questions, 7 without an answer: 3 of the 13 answerable ones right
    is EM 3/13 = 0.231 as the report scores it and 3/20 = 0.150 over all."""
    zero = {"em_scored": 0.0, "em": 0.0, "f1": 0.0, "judge_accuracy": 0.0, "retrieval_count": 0.0}
    after = {"em_scored": 3 / 13, "em": 3 / 20, "f1": 0.15, "judge_accuracy": 0.15, "retrieval_count": 2.0}
    text = format_summary({
        "run_id": "r", "recipe": "when-to-search", "collection": "c", "before": zero, "after": after,
        "report": "runs/r/report.md", "plots": [], "checkpoint": "ckpt",
    })  # fmt: skip
    lines = text.splitlines()
    assert lines[2].split() == ["EM", "(as", "the", "report)", "0.000", "0.231", "+0.231"]
    assert lines[3].split() == ["EM", "(all", "questions)", "0.000", "0.150", "+0.150"]
    assert lines[6].split() == ["retrievals", "/", "question", "0.000", "2.000", "+2.000"]


def test_pipeline_passes_the_corpus_to_the_flow() -> None:
    """``hoprl pipeline --corpus C``: the open-domain setting reaches the flow, whose spec keeps it."""
    import argparse
    import inspect

    from cli import pipeline as pipeline_cli
    from flows.pipeline import pipeline
    from flows.spec import RunSpec

    parser = argparse.ArgumentParser()
    pipeline_cli.add_arguments(parser)
    options = pipeline_cli.pipeline_options(parser.parse_args(["--small", "--corpus", "wiki18"]))
    assert options["corpus"] == "wiki18" and "corpus" in inspect.signature(pipeline.fn).parameters
    assert "corpus" not in pipeline_cli.pipeline_options(parser.parse_args(["--small"]))
    assert RunSpec(corpus="wiki18").corpus == "wiki18" and RunSpec().corpus is None
