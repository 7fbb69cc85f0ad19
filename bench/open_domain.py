"""A small open-domain corpus: questions' paragraphs and distractors, numbered as a Wikipedia dump is.

    python bench/open_domain.py --data ../shared/data/hotpotqa_dev.jsonl --questions 200 --n 5000
    hoprl ingest-corpus .hoprl/open-domain/corpus.jsonl --collection hotpot-open
    hoprl eval-answers --data .hoprl/open-domain/questions.jsonl --recipe naive-rag --limit 8
    hoprl eval-answers --data .hoprl/open-domain/questions.jsonl --recipe naive-rag --limit 8 \\
        --corpus hotpot-open

It writes ``--out``/questions.jsonl (the first ``--questions`` questions of ``--data``) and
``--out``/corpus.jsonl (FlashRAG JSONL): their paragraphs, de-duplicated as
:func:`hoprl.data.corpus.pool` does, and distractors up to ``--n`` passages, re-cut from the
paragraphs' own sentences and titled after the paragraph of their first sentence
(:func:`bench.corpus.build_corpus`'s recipe), all shuffled with ``--seed`` and given the ids
``0`` .. ``n-1``, as FlashRAG's ``wiki-18`` numbers its passages. So no corpus id is a question's
paragraph id, and a gold paragraph's title is carried by distractors too: the retrieval metrics can
count a gold paragraph only through :func:`hoprl.evaluation.corpus_gold`'s title and text matching.
The two ``eval-answers`` runs answer the same questions from their own pooled paragraphs (the
distractor setting) and from the corpus (the open-domain setting); docs/retrieval.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from hoprl.data.corpus import pool, recut
from hoprl.data.jsonl import load_questions, write_questions
from hoprl.domain import Question
from hoprl.schemas import Document


def build(questions: list[Question], n: int, seed: int) -> list[Document]:
    """The questions' pooled paragraphs and distractors up to ``n`` passages, shuffled, numbered."""
    rng = random.Random(seed)
    needles = pool(questions)
    if n < len(needles):
        raise ValueError(f"--n {n} is below the {len(needles)} paragraphs of the questions: raise it")
    distractors = recut(needles, n - len(needles), rng, "d")
    corpus = needles + distractors
    rng.shuffle(corpus)
    return [Document(id=str(i), title=d.title, text=d.text) for i, d in enumerate(corpus)]


def write_flashrag(path: Path, documents: list[Document]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for d in documents:
            f.write(json.dumps({"id": d.id, "contents": f'"{d.title}"\n{d.text}'}, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/hotpotqa_dev.jsonl"))
    parser.add_argument("--questions", type=int, default=200, help="the first N questions of --data")
    parser.add_argument("--n", type=int, default=5000, help="passages in the corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(".hoprl/open-domain"))
    args = parser.parse_args()
    questions = load_questions(args.data, args.questions)
    corpus = build(questions, args.n, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    write_questions(args.out / "questions.jsonl", questions)
    write_flashrag(args.out / "corpus.jsonl", corpus)
    needles = len(pool(questions))
    print(f"{len(questions)} questions, {len(corpus)} passages ({needles} of their paragraphs) in {args.out}")


if __name__ == "__main__":
    main()
