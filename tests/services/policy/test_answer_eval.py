"""``hoprl.answer_eval``: EM / F1 / retrieval count / latency through /v1/answer."""

from __future__ import annotations

from typing import Any

import pytest

from hoprl.answer_eval import AnswerSettings, evaluate_answers
from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import doc_id
from hoprl.domain import Paragraph, Question
from hoprl.recipes import get_recipe
from services.local import LocalServer
from services.policy.app import create_app

from .conftest import COLLECTION, small_settings

QUESTIONS = [
    Question(
        id=f"q{i}", dataset="tiny", split="dev", question=q, answers=[a],
        paragraphs=[Paragraph(title=t, text=x, is_gold=True), Paragraph(title="Brio", text="Brio cars.")],
    )
    for i, (q, a, t, x) in enumerate([
        ("Who founded Acme Records?", "Jane Roe", "Acme Records", "Acme Records was founded by Jane Roe."),
        ("What is the capital of Ostland?", "Velmora", "Ostland", "Velmora is the capital of Ostland."),
        ("How long is the Ansk?", "412 km", "Ansk", "The Ansk is a river of 412 km."),
    ])
]  # fmt: skip


def test_evaluate_answers_in_process_app(indexed: str, model_path: str) -> None:
    with LocalServer(create_app(small_settings(indexed, model_path))) as policy:
        report = evaluate_answers(policy.url, indexed, QUESTIONS, recipe="naive-rag", limit=2)
    assert report["questions"] == 2 and report["errors"] == 0
    assert report["collection"].startswith("eval-")
    assert 0 <= report["em"] <= report["f1"] <= 1
    assert report["retrieval_count"] == 1.0  # naive-rag retrieves once, with the question
    assert 0 < report["latency_p50_s"] <= report["latency_p99_s"]
    assert [p["id"] for p in report["predictions"]] == ["q0", "q1"]
    # The agent's retrieval is what its episodes retrieved: naive-rag's one search with the question
    # returns the recipe's top_k paragraphs, the same ones as asking the retriever directly (their
    # order among equal fused scores may differ between the two calls).
    top_k = get_recipe("naive-rag").top_k
    with RetrieverClient(indexed) as retriever:
        hits = retriever.search(
            report["collection"], [q.question for q in QUESTIONS[:2]], top_k=top_k, mode="hybrid"
        )
    direct = [list(dict.fromkeys(h.id.split("#")[0] for h in row)) for row in hits]
    assert [sorted(p["retrieved"]) for p in report["predictions"]] == [sorted(r) for r in direct]
    golds = [{doc_id(p.title, p.text) for p in q.paragraphs if p.is_gold} for q in QUESTIONS[:2]]
    found = [len(g & set(r)) / len(g) for g, r in zip(golds, direct, strict=True)]  # one gold each
    assert report["agent_recall"] == report["agent_full_recall"] == sum(found) / 2
    assert report["agent_k"] == sum(len(r) for r in direct) / 2


def test_evaluate_answers_over_a_url_counts_failures(policy_url: str, indexed: str) -> None:
    report = evaluate_answers(policy_url, indexed, QUESTIONS[:1], recipe="naive-rag", collection="missing")
    assert report["errors"] == 1 and report["outcomes"] == {"error": 1} and report["em"] == 0


def test_a_question_the_client_gives_up_on_is_a_failed_question(policy_url: str, indexed: str) -> None:
    """A reply slower than the client waits (a loaded CPU) fails that question, not the whole run:
    200 dev questions once ended in httpx.ReadTimeout and nothing was reported."""
    seen: list[dict[str, Any]] = []
    report = evaluate_answers(policy_url, indexed, QUESTIONS[:2], recipe="naive-rag", timeout_s=0.001,
                              on_answer=seen.append)  # fmt: skip
    assert report["questions"] == 2 and report["errors"] == 2 and report["outcomes"] == {"error": 2}
    assert all("Timeout" in row["error"] for row in report["predictions"])
    # a flow's progress lines (on_answer) count the failed questions too, each once
    assert sorted(r["id"] for r in seen) == sorted(r["id"] for r in report["predictions"])


def test_r2ag_answers_through_the_generation_step(policy_url: str, indexed: str) -> None:
    """R2AG's episodes retrieve and stop; its evaluation generates the answer from the retrieved
    documents (the paper's §3.2: the same generator as naive RAG), so it has EM / F1 to report.
    Sampled at the paper's temperature 0.6 and top-p 0.9 (App. C.2), seeded."""
    paper = AnswerSettings(max_steps=2, temperature=0.6, top_p=0.9, seed=1, generator="naive-rag",
                           generator_max_tokens=24)  # fmt: skip
    report = evaluate_answers(policy_url, indexed, QUESTIONS[:2], recipe="r2ag", settings=paper)
    assert report["errors"] == 0 and report["settings"]["generator"] == "naive-rag"
    rows = report["predictions"]
    assert all(r["outcome"] != "answer" and r["prediction"] for r in rows)  # the generator's answers
    assert all(r["generation_s"] > 0 and r["steps"] <= 2 for r in rows)
    bare = evaluate_answers(
        policy_url, indexed, QUESTIONS[:1], recipe="r2ag", settings=AnswerSettings(max_steps=2)
    )
    assert bare["predictions"][0]["prediction"] is None and bare["em"] == bare["f1"] == 0  # nothing to score


def test_open_domain_counts_the_corpus_passages_matched_to_gold(policy_url: str, indexed: str) -> None:
    """A corpus numbers its passages its own way: COLLECTION's ids are "acme", "roe", "velmora",
    "ansk", none of them a question paragraph's id. With ``corpus=True`` the gold paragraphs are
    found in it by title: q0's "Acme Records" is the passage "acme"; q1's gold paragraph "Ostland"
    has no passage of that title, so it stays gold and is never retrieved. Four hits a search on a
    four-passage collection retrieve every passage, so by hand: q0 Recall 1, Full-Recall 1, q1 0
    and 0; the means 0.5 and 0.5 at K = 4; AP of q0 = 1 / the rank of "acme"."""
    every = AnswerSettings(recipe_config={"top_k": 4})
    report = evaluate_answers(policy_url, indexed, QUESTIONS[:2], recipe="naive-rag", collection=COLLECTION,
                              settings=every, corpus=True)  # fmt: skip
    assert report["errors"] == 0 and report["corpus"] is True and report["gold_unmatched"] == 1
    q0, q1 = report["predictions"]
    assert sorted(q0["retrieved"]) == sorted(q1["retrieved"]) == ["acme", "ansk", "roe", "velmora"]
    assert q0["gold"] == ["acme"] and q0["gold_unmatched"] == 0
    assert (
        q1["gold"] == [doc_id("Ostland", "Velmora is the capital of Ostland.")] and q1["gold_unmatched"] == 1
    )
    assert report["agent_k"] == 4.0
    assert report["agent_recall"] == report["agent_full_recall"] == 0.5
    assert report["agent_map"] == (1 / (q0["retrieved"].index("acme") + 1)) / 2
    with pytest.raises(ValueError, match="name it"):
        evaluate_answers(policy_url, indexed, QUESTIONS[:1], corpus=True)
