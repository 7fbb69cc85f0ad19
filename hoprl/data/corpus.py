"""A retrieval corpus from questions: pool their paragraphs, de-duplicate, give stable ids.

The convention of the multi-hop retrieval papers: a benchmark file's corpus is the pool of all its
questions' paragraphs, de-duplicated by (title, text). A document id is a hash of (title, text), so
the same paragraph gets the same id in every run and on every machine (idempotent re-ingest).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable, Sequence

from hoprl.domain import Paragraph, Question
from hoprl.metrics.answer import f1
from hoprl.schemas import Document


def doc_id(title: str, text: str) -> str:
    """Stable id of a paragraph: 16 hex chars of SHA-1 over title and text."""
    return hashlib.sha1(f"{title}\x1f{text}".encode()).hexdigest()[:16]


def pool(questions: Iterable[Question]) -> list[Document]:
    """All paragraphs of ``questions``, de-duplicated by (title, text), in first-seen order."""
    seen: dict[str, Document] = {}
    for q in questions:
        for p in q.paragraphs:
            did = doc_id(p.title, p.text)
            if did not in seen:
                seen[did] = Document(id=did, title=p.title, text=p.text, metadata={"dataset": q.dataset})
    return list(seen.values())


def gold_paragraphs(question: Question) -> list[Paragraph]:
    """The question's gold paragraphs (``is_gold``, or title in ``gold_titles``)."""
    titles = set(question.gold_titles)
    return [p for p in question.paragraphs if p.is_gold or p.title in titles]


def gold_ids(question: Question) -> set[str]:
    """Ids of the question's gold paragraphs (:func:`gold_paragraphs`) in its own pooled corpus."""
    return {doc_id(p.title, p.text) for p in gold_paragraphs(question)}


def same_title(a: str, b: str) -> bool:
    """Titles match case- and whitespace-insensitively, as the recipes' rewards match them."""
    return " ".join(a.casefold().split()) == " ".join(b.casefold().split())


def text_overlap(passage: str, paragraph: str) -> float:
    """Token F1 of ``passage`` against ``paragraph`` after the official answer normalisation
    (:func:`hoprl.metrics.answer.f1`: lowercase, no punctuation or articles, words as a multiset)."""
    return f1(passage, [paragraph])


def corpus_match(paragraph: Paragraph, candidates: Sequence[Document]) -> tuple[str, float] | None:
    """The corpus passage among ``candidates`` that stands for the gold ``paragraph``, and its overlap.

    A corpus (a Wikipedia dump) numbers its passages its own way, so a gold paragraph is found in it
    by content: only a candidate with the paragraph's title can be it; of several with that title
    (an article cut into 100-word passages, or a distractor titled after it) the one whose text has
    the highest :func:`text_overlap` with the paragraph's, the earlier candidate on a tie. ``None``
    when no candidate has the title (the paragraph is not in the corpus).

    >>> gold = Paragraph(title="Ed Wood", text="Ed Wood was an American filmmaker.")
    >>> a = Document(id="7", title="Ed Wood", text="Wood was born in Poughkeepsie.")
    >>> b = Document(id="8", title="ed wood", text="Ed Wood was an American filmmaker and actor.")
    >>> found, overlap = corpus_match(gold, [a, b])  # 5 shared words: P = 5/7, R = 5/5, F1 = 10/12
    >>> found, round(overlap, 4)
    ('8', 0.8333)
    """
    same = [c for c in candidates if same_title(c.title, paragraph.title)]
    if not same:
        return None
    best = max(same, key=lambda c: text_overlap(c.text, paragraph.text))  # max keeps the first of ties
    return best.id, text_overlap(best.text, paragraph.text)


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


#: where a paragraph splits into sentences (after ., ! or ? and a space)
SENTENCE = re.compile(r"(?<=[.!?])\s+")


def recut(needles: Sequence[Document], n: int, rng: random.Random, prefix: str) -> list[Document]:
    """``n`` distractor passages re-cut from the needles' own sentences: each takes as many
    sentences as a needle drawn at random has, in shuffled order, under the title of its first
    sentence (so titles repeat, as a dump's do); ids are ``prefix`` and a number. Real text with the
    needles' vocabulary and length, but no paragraph a question was written from."""
    sentences = [(d.title, s) for d in needles for s in SENTENCE.split(d.text) if s.strip()]
    rng.shuffle(sentences)
    lengths = [max(1, len(SENTENCE.split(d.text))) for d in needles]
    distractors, at = [], 0
    for i in range(n):
        k = rng.choice(lengths)
        if at + k > len(sentences):
            rng.shuffle(sentences)
            at = 0
        chosen, at = sentences[at : at + k], at + k
        text = " ".join(s for _, s in chosen)
        distractors.append(Document(id=f"{prefix}{i}", title=chosen[0][0], text=text))
    return distractors


def chunk(documents: Iterable[Document], max_words: int = 200, overlap: int = 1) -> list[Document]:
    """Split long documents into chunks of at most ``max_words`` words on sentence boundaries.

    Chunks repeat the last ``overlap`` sentences of the previous chunk, keep the title, and get ids
    ``<doc id>#<n>`` with ``metadata.parent`` = the document id. Short documents stay whole.
    """
    out: list[Document] = []
    for doc in documents:
        if len(doc.text.split()) <= max_words:
            out.append(doc)
            continue
        sentences = _SENTENCE.split(doc.text)
        start, n = 0, 0
        while start < len(sentences):
            end, words = start, 0
            while end < len(sentences) and (words == 0 or words + len(sentences[end].split()) <= max_words):
                words += len(sentences[end].split())
                end += 1
            text = " ".join(sentences[start:end])
            meta = {**doc.metadata, "parent": doc.id, "chunk": n}
            out.append(Document(id=f"{doc.id}#{n}", title=doc.title, text=text, metadata=meta))
            n += 1
            start = end if end >= len(sentences) else max(start + 1, end - overlap)
    return out
