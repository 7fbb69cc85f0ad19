"""``flows.evaluate``'s scoring of refusals: no services (an unanswerable question is not graded by
the judge, so nothing is sent to it)."""

from __future__ import annotations

import json
from pathlib import Path

from flows.evaluate import judge_answers, predictions
from hoprl.domain import Question


def test_refusing_an_unanswerable_question_is_correct(tmp_path: Path) -> None:
    """The policy's outcome is ``"refuse"``; the flow compared it with ``"refused"``, so a refusal
    never counted as correct and no prediction was stored as refused."""
    questions = [
        Question(id=f"u{i}", dataset="tiny", split="test", question="Who?", answers=[]) for i in range(2)
    ]
    rows = [
        {"id": "u0", "prediction": None, "answers": [], "outcome": "refuse", "em": 0.0, "f1": 0.0,
         "retrievals": 1, "latency_s": 0.5},
        {"id": "u1", "prediction": "Paris", "answers": [], "outcome": "answer", "em": 0.0, "f1": 0.0,
         "retrievals": 1, "latency_s": 0.5},
    ]  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(rows))
    # no answerable row: the judge (a closed port here) is never asked
    verdicts = judge_answers.fn(str(tmp_path / "p.json"), questions, "http://127.0.0.1:9")
    assert verdicts == [True, False]
    assert [p.refused for p in predictions(rows, verdicts)] == [True, False]
