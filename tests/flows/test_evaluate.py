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


def test_the_index_retrieval_counts_on_a_corpus(retriever_url: str) -> None:
    """A corpus's own ids ("0", "1"): with ``corpus=True`` the gold paragraph is its passage "0"
    (same title and text), and a 2-passage corpus returns both in the top 2, so by hand Recall@2 =
    Full-Recall@2 = 1; scored against the paragraph's own id the same search finds nothing."""
    from flows.evaluate import retrieval_metrics
    from hoprl.clients.retriever import RetrieverClient
    from hoprl.domain import Paragraph
    from hoprl.schemas import Document

    with RetrieverClient(retriever_url) as client:
        client.ingest("flows-corpus", [
            Document(id="0", title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe."),
            Document(id="1", title="Jane Roe", text="Jane Roe was born in Velmora."),
        ])  # fmt: skip
    gold = Paragraph(title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe.", is_gold=True)
    question = Question(id="q", dataset="tiny", split="test", question="Who founded Acme Records?",
                        answers=["Jane Roe"], paragraphs=[gold])  # fmt: skip
    found = retrieval_metrics.fn([question], "flows-corpus", retriever_url, corpus=True)
    assert found["recall@2"] == found["full_recall@2"] == found["recall@10"] == 1.0
    assert retrieval_metrics.fn([question], "flows-corpus", retriever_url)["recall@10"] == 0.0


def test_the_index_retrieval_of_more_questions_than_one_search_takes(retriever_url: str) -> None:
    """300 questions (a search request takes at most 256: make demo-rl's 340 failed with a 422):
    scored in several searches, each question against its own gold paragraph. Half of them ask for
    the one paragraph and half for the other; each paragraph is found in the top 2, so by hand every
    Recall@2 is 1 and the report counts the 300 as one."""
    from flows.evaluate import retrieval_metrics
    from hoprl.clients.retriever import RetrieverClient
    from hoprl.data.corpus import doc_id
    from hoprl.domain import Paragraph
    from hoprl.schemas import Document

    texts = [("Acme Records", "Acme Records was founded in 1961 by Jane Roe."),
             ("Jane Roe", "Jane Roe was born in Velmora.")]  # fmt: skip
    with RetrieverClient(retriever_url) as client:  # the ids the pipeline's index gives paragraphs
        client.ingest("flows-many", [Document(id=doc_id(t, x), title=t, text=x) for t, x in texts])
    questions = [
        Question(id=f"q{i}", dataset="tiny", split="test", question=texts[i % 2][1], answers=["x"],
                 paragraphs=[Paragraph(title=texts[i % 2][0], text=texts[i % 2][1], is_gold=True)])
        for i in range(300)
    ]  # fmt: skip
    found = retrieval_metrics.fn(questions, "flows-many", retriever_url)
    assert found["recall@2"] == found["full_recall@2"] == 1.0
