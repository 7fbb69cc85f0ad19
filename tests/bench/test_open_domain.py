"""bench/open_domain.py's corpus: the questions' paragraphs and distractors under the titles of
theirs, numbered 0..n-1 as a Wikipedia dump is, so only title and text tie a passage to gold."""

from __future__ import annotations

from pathlib import Path

import pytest

from hoprl.data.corpus import gold_ids, pool
from hoprl.data.passages import read_passages
from hoprl.data.synthetic import generate
from tests.conftest import load_script

bench = load_script("bench/open_domain.py", "bench_open_domain")


def test_numbered_needles_and_distractors(tmp_path: Path) -> None:
    questions = generate(seed=1, n_entities=60, n_train=0, n_dev=10, n_test=0)["dev"]
    needles = pool(questions)
    corpus = bench.build(questions, len(needles) + 30, seed=3)
    assert [d.id for d in corpus] == [str(i) for i in range(len(needles) + 30)]
    pairs = {(d.title, d.text) for d in corpus}
    assert {(d.title, d.text) for d in needles} <= pairs  # every paragraph, once
    assert not {d.id for d in corpus} & {i for q in questions for i in gold_ids(q)}  # no gold id
    titles = [d.title for d in corpus]
    assert len(set(titles)) < len(titles)  # distractors carry their paragraphs' titles
    assert [(d.title, d.text) for d in bench.build(questions, len(needles) + 30, seed=3)] == [
        (d.title, d.text) for d in corpus
    ]  # seeded
    with pytest.raises(ValueError, match="raise it"):
        bench.build(questions, len(needles) - 1, seed=3)
    bench.write_flashrag(tmp_path / "corpus.jsonl", corpus)
    back = [
        (p.document.id, p.document.title, p.document.text) for p in read_passages(tmp_path / "corpus.jsonl")
    ]
    assert back == [(d.id, d.title, d.text) for d in corpus]
