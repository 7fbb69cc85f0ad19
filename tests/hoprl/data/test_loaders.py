"""Common-schema JSONL, hub row mappers (on rows the test writes), corpus pooling and chunking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hoprl.data.corpus import chunk, doc_id, gold_ids, pool
from hoprl.data.hub import HUB, hub_location, load_hub
from hoprl.data.jsonl import DataError, load_questions, write_questions
from hoprl.data.sources import load
from hoprl.schemas import Document
from tests.conftest import shared_file

HOTPOT_ROW = {
    "id": "5a8b57f25542995d1e6f1371",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "answer": "yes",
    "type": "comparison",
    "level": "hard",
    "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
    "context": {
        "title": ["Ed Wood (film)", "Scott Derrickson", "Ed Wood"],
        "sentences": [
            ["Ed Wood is a 1994 American biographical film.", " It was directed by Tim Burton."],
            ["Scott Derrickson (born July 16, 1966) is an American director."],
            ["Edward Davis Wood Jr. was an American filmmaker."],
        ],
    },
}
TWOWIKI_ROW = {
    "_id": "13f5ad2c088c11ebbd6fac1f6bf848b6",
    "type": "compositional",
    "question": "Who is the mother of the director of film Polish-Russian War?",
    "context": [
        ["Polish-Russian War (film)", ["Polish-Russian War is a 2009 film directed by Xawery Żuławski."]],
        ["Xawery Żuławski", ["His mother is Małgorzata Braunek."]],
        ["Other", ["Unrelated."]],
    ],
    "supporting_facts": [["Polish-Russian War (film)", 0], ["Xawery Żuławski", 0]],
    "answer": "Małgorzata Braunek",
}
MUSIQUE_ROW = {
    "id": "2hop__1_2",
    "question": "Who founded the label of the album Velvet?",
    "answer": "Jane Roe",
    "answer_aliases": ["J. Roe"],
    "answerable": True,
    "question_decomposition": [{"id": 1}, {"id": 2}],
    "paragraphs": [
        {
            "idx": 0,
            "title": "Velvet",
            "paragraph_text": "Velvet was released by Acme.",
            "is_supporting": True,
        },
        {"idx": 1, "title": "Acme", "paragraph_text": "Acme was founded by Jane Roe.", "is_supporting": True},
        {"idx": 2, "title": "Noise", "paragraph_text": "Unrelated text.", "is_supporting": False},
    ],
}


def test_hotpotqa_row_maps_to_common_schema() -> None:
    q = HUB["hotpotqa"].mapper(HOTPOT_ROW, "dev")
    assert q.dataset == "hotpotqa" and q.answers == ["yes"] and q.type == "comparison"
    assert (
        q.paragraphs[0].text == "Ed Wood is a 1994 American biographical film. It was directed by Tim Burton."
    )
    assert q.gold_titles == ["Scott Derrickson", "Ed Wood"]
    assert [p.is_gold for p in q.paragraphs] == [False, True, True]


def test_2wiki_and_musique_rows() -> None:
    w = HUB["2wiki"].mapper(TWOWIKI_ROW, "dev")
    assert w.id == TWOWIKI_ROW["_id"] and w.gold_titles == ["Polish-Russian War (film)", "Xawery Żuławski"]
    m = HUB["musique"].mapper(MUSIQUE_ROW, "train")
    assert m.answers == ["Jane Roe", "J. Roe"] and m.type == "2hop" and len(m.gold_titles) == 2
    unanswerable = HUB["musique"].mapper({**MUSIQUE_ROW, "answerable": False}, "dev")
    assert unanswerable.answers == [] and not unanswerable.answerable


@pytest.mark.parametrize(
    ("name", "row", "answers"),
    [
        ("bamboogle", {"Question": "Who was president when X?", "Answer": "Lincoln"}, ["Lincoln"]),
        (
            "nq",
            {"question": "who sang thriller", "answer": ["Michael Jackson", "MJ"]},
            ["Michael Jackson", "MJ"],
        ),
        (
            "triviaqa",
            {
                "question": "Q?",
                "question_id": "tq1",
                "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"]},
            },
            ["Paris", "City of Light"],
        ),
        (
            "popqa",
            {"id": 7, "question": "What is X's occupation?", "possible_answers": '["actor", "actress"]'},
            ["actor", "actress"],
        ),
    ],
)
def test_open_domain_rows(name: str, row: dict, answers: list[str]) -> None:
    q = HUB[name].mapper(row, "dev")
    assert q.answers == answers and q.paragraphs == [] and q.dataset == name


def test_load_hub_reads_hub_shaped_local_files(tmp_path: Path) -> None:
    """The loading path itself (datasets.load_dataset + mapper), offline, on rows in the hub's format."""
    path = tmp_path / "hotpot.jsonl"
    path.write_text(json.dumps(HOTPOT_ROW) + "\n" + json.dumps({**HOTPOT_ROW, "id": "b"}) + "\n")
    questions = load_hub("hotpotqa", "dev", data_files=str(path))
    assert [q.id for q in questions] == [HOTPOT_ROW["id"], "b"]
    with pytest.raises(KeyError, match="valid: 2wiki, bamboogle"):
        load_hub("hotpot", "dev")
    with pytest.raises(ValueError, match="no split 'train'"):
        load_hub("bamboogle", "train")


def test_shared_jsonl_reads_in_place_and_round_trips(tmp_path: Path) -> None:
    questions = load_questions(shared_file("hotpotqa_dev.jsonl"), limit=5)
    assert len(questions) == 5 and all(len(q.paragraphs) >= 2 and len(q.gold_titles) == 2 for q in questions)
    write_questions(tmp_path / "copy.jsonl", questions)
    assert load_questions(tmp_path / "copy.jsonl") == questions
    assert len(load("synthetic", split="dev", limit=3)) == 3
    assert {q.type for q in load("synthetic:0:2", split="dev")} == {"bridge-2", "comparison"}
    with pytest.raises(DataError, match="synthetic:SEED:MAX_HOPS"):
        load("synthetic:zero")


def test_bad_files_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "1", "dataset": "x", "split": "dev", "question": "q"}) + "\n{oops\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        load_questions(bad)
    with pytest.raises(DataError, match="no such file"):
        load_questions(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="neither a file"):
        load("no-such-dataset")


def test_pool_dedupes_with_stable_ids() -> None:
    questions = load_questions(shared_file("hotpotqa_dev.jsonl"))
    docs = pool(questions)
    assert len(docs) == len({(d.title, d.text) for d in docs}) == 5193
    assert docs[0].id == doc_id(docs[0].title, docs[0].text) == pool(questions[:1])[0].id
    assert all(gold_ids(q) <= {d.id for d in docs} and len(gold_ids(q)) == 2 for q in questions)


def test_chunk_splits_long_documents_on_sentences() -> None:
    long = Document(id="d", title="T", text=" ".join(f"Sentence number {i} is here." for i in range(60)))
    short = Document(id="s", title="S", text="Short.")
    chunks = chunk([long, short], max_words=50, overlap=1)
    assert chunks[-1] == short
    parts = [c for c in chunks if c.metadata.get("parent") == "d"]
    assert len(parts) > 1 and all(len(c.text.split()) <= 50 for c in parts)
    assert [c.id for c in parts] == [f"d#{i}" for i in range(len(parts))]
    covered = " ".join(c.text for c in parts)
    assert all(f"Sentence number {i} is here." in covered for i in range(60))


def test_the_open_domain_test_sets_the_protocols_name(tmp_path: Path) -> None:
    """Eval-RAR App. A.4, Table 4 evaluates NQ test (3,610) and TriviaQA test (11,313): on the hub
    NQ-open's 3,610-question validation split and TriviaQA's unfiltered.nocontext validation split
    (11,313; rc.nocontext's validation is a different set)."""
    assert hub_location("nq", "test") == ("google-research-datasets/nq_open", None, "validation")
    assert hub_location("triviaqa", "test") == ("mandarjoshi/trivia_qa", "unfiltered.nocontext", "validation")
    assert hub_location("triviaqa", "dev") == ("mandarjoshi/trivia_qa", "rc.nocontext", "validation")
    nq_rows = [{"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]}]
    trivia_rows = [{"question": "Capital of France?", "question_id": "tc_1",
                    "answer": {"value": "Paris", "aliases": ["Paris", "Paree"]}}]  # fmt: skip
    for name, rows, answers in (
        ("nq", nq_rows, ["William Shakespeare", "Shakespeare"]),
        ("triviaqa", trivia_rows, ["Paris", "Paree"]),
    ):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (q,) = load_hub(name, "test", data_files=str(path))
        assert (q.dataset, q.split, q.answers, q.paragraphs) == (name, "test", answers, [])


def test_every_protocol_set_with_a_loader_names_a_split_it_has() -> None:
    from hoprl.protocols import PROTOCOLS

    for protocol in PROTOCOLS.values():
        for evalset in protocol.sets:
            if evalset.dataset in HUB:
                assert hub_location(evalset.dataset, evalset.split)[2]  # no ValueError


def test_a_synthetic_test_field_sizes_the_test_split_alone() -> None:
    """``synthetic:SEED:MAX_HOPS:TEST``: the test split's size; train and dev and the first test
    questions are those of ``synthetic:SEED:MAX_HOPS``."""
    assert len(load("synthetic:0:2:300", split="test")) == 300
    assert load("synthetic:0:2:300", split="test")[:150] == load("synthetic:0:2", split="test")
    assert load("synthetic:0:2:40", split="test") == load("synthetic:0:2", split="test")[:40]
    assert load("synthetic:0:2:300", split="train") == load("synthetic:0:2", split="train")
    with pytest.raises(DataError, match="synthetic:SEED:MAX_HOPS:TEST"):
        load("synthetic:0:2:300:1")
    with pytest.raises(DataError, match="at least one question"):
        load("synthetic:0:2:0")
    with pytest.raises(DataError, match="fewer than 99850 more test questions"):
        load("synthetic:0:2:100000", split="test")
