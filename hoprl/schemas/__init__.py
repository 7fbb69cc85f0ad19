"""Wire contracts: every model a service and its client exchange, in one place.

One module per service holds its requests and responses (:mod:`hoprl.schemas.retriever`,
:mod:`~hoprl.schemas.policy` with :mod:`~hoprl.schemas.policy_openai`, :mod:`~hoprl.schemas.judge`,
:mod:`~hoprl.schemas.trainer`); the service validates with them and defines its OpenAPI document
from them, and its client (:mod:`hoprl.clients`) parses with the same classes, so the two cannot
drift apart. They are plain pydantic, with no server dependency.

This module holds what every layer shares: the common question schema, documents and the error
body. The question schema is the one of ``../shared/data`` (one JSON object per line)::

    {"id", "dataset", "split", "question", "answers": [gold first, then aliases], "type",
     "paragraphs": [{"title", "text", "is_gold"}], "gold_titles": [...]}

Every loader (local JSONL, Hugging Face hub, the synthetic world) produces :class:`Question`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

#: a string holding at least one visible character: not only whitespace, NUL or other ASCII control
#: characters. A request field that must say something carries it as its OpenAPI ``pattern`` (with
#: ``minLength: 1``), so the published schema and the validation are one rule (the 422 says so in
#: words: :func:`services.errors.validation_message`).
VISIBLE = r"[^\s\x00-\x1f\x7f]"
#: the message for a string that fails :data:`VISIBLE`
VISIBLE_MESSAGE = (
    "must hold at least one visible character (not only spaces or control characters such as NUL)"
)


def non_blank(max_length: int) -> StringConstraints:
    """The constraints of a request string that must say something, in 1 to ``max_length`` characters."""
    return StringConstraints(min_length=1, max_length=max_length, pattern=VISIBLE)


#: a non-blank identifier-like string of at most 256 characters (ids, names, titles a client sends)
Name = Annotated[str, non_blank(256)]


class Paragraph(BaseModel):
    title: str
    text: str
    is_gold: bool = False


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


class Document(BaseModel):
    """A retrievable passage. ``id`` is stable: see :func:`hoprl.data.corpus.doc_id`."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, non_blank(256)]
    title: str = Field(default="", max_length=2_000)
    text: Annotated[str, non_blank(100_000)] = Field(description="at least one visible character")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer of every service has this JSON body."""

    error: str = Field(description="machine-readable error code, e.g. 'collection_not_found'")
    message: str = Field(description="what went wrong and how to fix it")
    detail: Any = None
