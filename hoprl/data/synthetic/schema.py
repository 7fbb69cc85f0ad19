"""The synthetic question's schema: a common-schema question plus its gold hop chain.

:func:`hops_for` gives the chain of any question (a real benchmark's too, as a best effort), so
recipes' experts and the evaluation read hops the same way whatever the data set.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from hoprl.domain import Paragraph, Question


class Hop(BaseModel):
    """One step of a gold reasoning chain: read ``title``'s paragraph to learn ``relation``."""

    title: str = Field(description="title of the paragraph that states this hop's fact")
    relation: str = Field(description="relation or attribute read here, e.g. 'founded_by'; '' if unknown")
    query: str = Field(description="a good search query for this hop's paragraph")
    answer: str | None = Field(
        description="the intermediate answer; None when the fact is absent (synthetic, withheld) or "
        "unknown (a real benchmark's bridge hop, whose relation is '')"
    )


class SyntheticQuestion(Question):
    """A common-schema question plus its gold hop chain (readers of the common schema ignore it)."""

    hops: list[Hop] = Field(default_factory=list)


def read_jsonl(path: str | Path) -> list[SyntheticQuestion]:
    """Read synthetic questions back with their ``hops`` (a common-schema file gives ``hops=[]``)."""
    with Path(path).open(encoding="utf-8") as f:
        return [SyntheticQuestion.model_validate_json(line) for line in f if line.strip()]


def hops_for(question: Question) -> list[Hop]:
    """The gold hop chain of a question.

    Synthetic questions carry theirs. For a real benchmark question the chain is a best effort:
    one hop per gold paragraph, ``query`` = its title, ``relation`` = "" (unknown). Order: the
    paragraph whose title the question names comes first (the bridge entity is usually named),
    the one containing the gold answer last, and that last hop's ``answer`` is the gold answer;
    other intermediate answers are unknown (None).
    """
    if isinstance(question, SyntheticQuestion) and question.hops:
        return list(question.hops)
    gold = [p for p in question.paragraphs if p.is_gold] or [
        p for p in question.paragraphs if p.title in question.gold_titles
    ]
    answer = question.answers[0] if question.answers else None
    text = question.question.lower()

    def contains_answer(p: Paragraph) -> bool:
        return answer is not None and answer.lower() in p.text.lower()

    ordered = sorted(gold, key=lambda p: (p.title.lower() not in text, contains_answer(p)))
    return [
        Hop(
            title=p.title,
            relation="",
            query=p.title,
            answer=answer if i == len(ordered) - 1 and contains_answer(p) else None,
        )
        for i, p in enumerate(ordered)
    ]
