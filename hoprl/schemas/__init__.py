"""Wire contracts: every model a service and its client exchange, in one place.

One module per service holds its requests and responses (:mod:`hoprl.schemas.retriever`,
:mod:`~hoprl.schemas.policy` with :mod:`~hoprl.schemas.policy_openai`, :mod:`~hoprl.schemas.judge`,
:mod:`~hoprl.schemas.trainer`); the service validates with them and defines its OpenAPI document
from them, and its client (:mod:`hoprl.clients`) parses with the same classes, so the two cannot
drift apart. They are plain pydantic, with no server dependency.

This module holds what every service shares: documents and the error body, and the common
question schema (:class:`hoprl.domain.Question`, re-exported: it travels in requests too).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from hoprl.domain import Paragraph, Question
from hoprl.domain.jsontypes import (
    MAX_JSON_INT,
    VISIBLE,
    VISIBLE_MESSAGE,
    Bool,
    Float,
    Int,
    json_number,
    json_typed,
    non_blank,
)

#: the question schema and JSON's own types are re-exported: every wire model uses them
__all__ = [
    "MAX_JSON_INT",
    "VISIBLE",
    "VISIBLE_MESSAGE",
    "Bool",
    "Document",
    "ErrorBody",
    "Float",
    "Int",
    "Paragraph",
    "Question",
    "json_number",
    "json_typed",
    "non_blank",
]


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
