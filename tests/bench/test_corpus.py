"""bench/corpus.py's corpus: needles (every paragraph of the question files, once) and distractors
re-cut from their sentences, written as a FlashRAG file the passage reader reads back."""

from __future__ import annotations

from pathlib import Path

from hoprl.data.corpus import SENTENCE, gold_ids, pool
from hoprl.data.jsonl import write_questions
from hoprl.data.passages import read_passages
from hoprl.data.synthetic import generate
from tests.conftest import load_script

bench = load_script("bench/corpus.py", "bench_corpus")


def question_files(folder: Path) -> list:
    splits = generate(seed=1, n_entities=60, n_train=20, n_dev=10, n_test=0)
    for split, questions in splits.items():
        write_questions(folder / f"synthetic_{split}.jsonl", questions)
    return [q for qs in splits.values() for q in qs]


def test_needles_then_distractors_from_their_sentences(tmp_path: Path) -> None:
    questions = question_files(tmp_path)
    needles = {d.id: d for d in pool(questions)}
    corpus, answerable = bench.build_corpus(tmp_path, len(needles) + 50, seed=3)
    ids = [d.id for d in corpus]
    assert len(ids) == len(set(ids)) == len(needles) + 50
    assert set(needles) <= set(ids)
    distractors = [d for d in corpus if d.id.startswith("distractor-")]
    sentences = {s for d in needles.values() for s in SENTENCE.split(d.text)}
    assert len(distractors) == 50
    assert all(set(SENTENCE.split(d.text)) <= sentences for d in distractors)  # real text, re-cut
    assert answerable and all(gold_ids(q) <= set(ids) for q in answerable)
    again, _ = bench.build_corpus(tmp_path, len(needles) + 50, seed=3)
    assert [d.id for d in again] == ids  # seeded

    path = tmp_path / "corpus.jsonl"
    bench.write_flashrag(path, corpus)
    read = [(p.document.id, p.document.title, p.document.text) for p in read_passages(path)]
    assert read == [(d.id, d.title, d.text) for d in corpus]


def test_a_smaller_corpus_samples_the_needles(tmp_path: Path) -> None:
    question_files(tmp_path)
    corpus, answerable = bench.build_corpus(tmp_path, 30, seed=0)
    assert len(corpus) == 30 and not any(d.id.startswith("distractor-") for d in corpus)
    assert all(gold_ids(q) <= {d.id for d in corpus} for q in answerable)
