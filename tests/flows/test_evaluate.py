"""``flows.evaluate``'s scoring of refusals: no services (an unanswerable question is not graded by
the judge, so nothing is sent to it)."""

from __future__ import annotations

import json
from pathlib import Path

from flows.evaluate import judge_answers, judge_llm_share, predictions
from hoprl.data.jsonl import write_questions
from hoprl.schemas import Question


def test_refusing_an_unanswerable_question_is_correct(tmp_path: Path) -> None:
    """The policy's outcome is ``"refuse"``; the flow compared it with ``"refused"``, so a refusal
    never counted as correct and no prediction was stored as refused."""
    questions = [
        Question(id=f"u{i}", dataset="tiny", split="test", question="Who?", answers=[]) for i in range(2)
    ]
    write_questions(tmp_path / "q.jsonl", questions)
    rows = [
        {"id": "u0", "prediction": None, "answers": [], "outcome": "refuse", "em": 0.0, "f1": 0.0,
         "retrievals": 1, "latency_s": 0.5},
        {"id": "u1", "prediction": "Paris", "answers": [], "outcome": "answer", "em": 0.0, "f1": 0.0,
         "retrievals": 1, "latency_s": 0.5},
    ]  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(rows))
    # no answerable row: the judge (a closed port here) is never asked
    verdicts = judge_answers.fn(
        str(tmp_path / "p.json"), str(tmp_path / "q.jsonl"), None, "http://127.0.0.1:9"
    )
    assert verdicts == [True, False]
    assert [p.refused for p in predictions(rows, verdicts)] == [True, False]


def test_each_judged_row_says_whether_an_llm_decided(tmp_path: Path) -> None:
    """The rules backend of a live judge service grades one answer: its row says no LLM decided,
    and the evaluation's ``judge_llm_share`` is 0 (the report then warns)."""
    from services.judge.app import create_app
    from services.judge.settings import JudgeSettings
    from services.local import LocalServer

    questions = [Question(id="a", dataset="tiny", split="test", question="Who?", answers=["Jane Roe"]),
                 Question(id="u", dataset="tiny", split="test", question="Who?", answers=[])]  # fmt: skip
    write_questions(tmp_path / "q.jsonl", questions)
    rows = [
        {"id": "a", "prediction": "Jane Roe", "answers": ["Jane Roe"], "outcome": "answer", "em": 1.0,
         "f1": 1.0, "retrievals": 1, "latency_s": 0.5},
        {"id": "u", "prediction": None, "answers": [], "outcome": "refuse", "em": 0.0, "f1": 0.0,
         "retrievals": 1, "latency_s": 0.5},
    ]  # fmt: skip
    (tmp_path / "p.json").write_text(json.dumps(rows))
    with LocalServer(create_app(JudgeSettings())) as judge:
        verdicts = judge_answers.fn(str(tmp_path / "p.json"), str(tmp_path / "q.jsonl"), None, judge.url)
    assert verdicts == [True, True]  # "Jane Roe" is the reference; the refusal of "u" is right
    stored = json.loads((tmp_path / "p.json").read_text())
    assert [r.get("judge_llm") for r in stored] == [False, None]  # only the graded row is judged
    assert judge_llm_share(stored) == 0.0 and judge_llm_share(rows) is None
