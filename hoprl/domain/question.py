"""The common question schema: one JSON object per line in every dataset file::

    {"id", "dataset", "split", "question", "answers": [gold first, then aliases], "type",
     "paragraphs": [{"title", "text", "is_gold"}], "gold_titles": [...]}

Every loader (local JSONL, Hugging Face hub, the synthetic world) produces :class:`Question`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class Paragraph(BaseModel):
    title: str
    text: str
    is_gold: StrictBool = False


class Question(BaseModel):
    """One question in the common schema; ``answers[0]`` is the gold answer, the rest aliases."""

    model_config = ConfigDict(extra="ignore")

    id: str
    dataset: str
    split: str
    question: str
    answers: list[str] = Field(default_factory=list)
    type: str | None = None
    paragraphs: list[Paragraph] = Field(default_factory=list)
    gold_titles: list[str] = Field(default_factory=list)

    @property
    def answerable(self) -> bool:
        """Unanswerable questions (the synthetic world's) carry no answers."""
        return bool(self.answers)
