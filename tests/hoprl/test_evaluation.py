"""``hoprl.evaluation``: gold paragraphs found in a corpus collection (its own ids), on the live
retriever, and the retrieval metrics counted through them (numbers by hand)."""

from __future__ import annotations

import pytest

from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import doc_id, gold_ids
from hoprl.domain import Paragraph, Question
from hoprl.evaluation import corpus_gold, evaluate_retrieval, gold_sets
from hoprl.metrics.retrieval import retrieval_report
from hoprl.schemas import Document

CORPUS = "corpus-gold-test"
#: numbered as a Wikipedia dump numbers its passages; "Acme Records" is cut in two passages
PASSAGES = [
    Document(id="0", title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe."),
    Document(id="1", title="Acme Records", text="Acme Records moved its studio to Velmora in 1970."),
    Document(id="2", title="Jane Roe", text="Jane Roe was born in Velmora."),
    Document(id="3", title="Velmora", text="Velmora is the capital of Ostland."),
]
ACME = Paragraph(title="Acme Records", text="Acme Records was founded in 1961 by Jane Roe.", is_gold=True)
ROE = Paragraph(title="Jane Roe", text="Jane Roe was born in Velmora, a city in Ostland.", is_gold=True)
BRIO = Paragraph(title="Brio", text="Brio makes wooden toy trains.", is_gold=True)  # not in the corpus
QUESTION = Question(
    id="q", dataset="tiny", split="dev", question="Where was the founder of Acme Records born?",
    answers=["Velmora"], paragraphs=[ACME, ROE, BRIO, Paragraph(title="Velmora", text="Velmora is big.")],
)  # fmt: skip


@pytest.fixture(scope="module")
def corpus(retriever_url: str) -> str:
    with RetrieverClient(retriever_url) as client:
        client.ingest(CORPUS, PASSAGES)
    return retriever_url


def test_gold_paragraphs_found_by_title_then_text(corpus: str) -> None:
    with RetrieverClient(corpus) as client:
        (found,) = corpus_gold(client, CORPUS, [QUESTION])
    # Acme Records: two passages with the title; "0" holds the paragraph's very text (F1 1.0), "1"
    # shares only "acme records" of its words. Jane Roe: one passage with the title, whatever its
    # text. Brio: no passage has the title. The distractor paragraph (Velmora) is not gold.
    assert found == {
        doc_id(ACME.title, ACME.text): "0",
        doc_id(ROE.title, ROE.text): "2",
        doc_id(BRIO.title, BRIO.text): None,
    }
    (gold,) = gold_sets([found])
    assert gold == {"0", "2", doc_id(BRIO.title, BRIO.text)}  # Brio stays gold, never retrieved
    # a ranking of corpus ids: "2" at rank 2, "0" at rank 4, Brio nowhere
    ranking = ["1", "2", "3", "0"]
    report = retrieval_report([ranking], [gold], ks=[2, 4])
    assert report["recall@2"] == pytest.approx(1 / 3)
    assert report["recall@4"] == pytest.approx(2 / 3)
    assert report["full_recall@4"] == 0.0  # Brio is missing
    assert report["map@4"] == pytest.approx((1 / 2 + 2 / 4) / 3)  # precision at each hit, over |gold|
    # against the questions' own paragraph ids the same ranking scores nothing: the corpus's ids differ
    assert retrieval_report([ranking], [gold_ids(QUESTION)], ks=[4])["recall@4"] == 0.0


def test_evaluate_retrieval_on_a_corpus(corpus: str) -> None:
    with RetrieverClient(corpus) as client:
        report = evaluate_retrieval(client, [QUESTION], ["dense"], [4], corpus=CORPUS)
        assert report.collection == CORPUS and report.documents == 4 and report.index_rate == 0.0
        # top 4 of a 4-passage corpus holds every passage: both gold passages found, Brio never
        assert report.results["dense"]["recall@4"] == pytest.approx(2 / 3)
        assert report.results["dense"]["full_recall@4"] == 0.0
        with pytest.raises(ValueError, match="collection 'nowhere' does not exist: ingest it first"):
            evaluate_retrieval(client, [QUESTION], ["dense"], [4], corpus="nowhere")
