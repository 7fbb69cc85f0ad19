"""The judge service's wire contracts: answer-equivalence and answerability items, in batches,
and the verdicts (a :class:`~hoprl.judging.Verdict` plus how the service produced it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hoprl.judging import Verdict

MAX_TEXT = 20_000  # characters in a question, prediction or reference
MAX_PASSAGE = 100_000  # characters in one evidence passage
MAX_LIST = 256  # references or passages in one item
MAX_BATCH = 256  # items in one request (JUDGE_MAX_BATCH may lower it)


class AnswerItem(BaseModel):
    """One prediction to grade against the gold answer and its aliases."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(default="", max_length=MAX_TEXT, description="context for LLM judges")
    prediction: str = Field(max_length=MAX_TEXT, description="may be empty (an empty answer is wrong)")
    references: list[str] = Field(
        min_length=1,
        max_length=MAX_LIST,
        description="gold answer first, then aliases; at least one (an answer needs a reference)",
    )


class AnswerableItem(BaseModel):
    """One question and the evidence it should be answerable from."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(max_length=MAX_TEXT)
    evidence: list[str] = Field(max_length=MAX_LIST, description="passages; may be empty")
    references: list[str] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="gold answers when known; [] = the question has no answer; null = unknown",
    )


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[AnswerItem] = Field(
        min_length=1, max_length=MAX_BATCH, description="a batch of at most JUDGE_MAX_BATCH items"
    )


class AnswerableRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[AnswerableItem] = Field(
        min_length=1, max_length=MAX_BATCH, description="a batch of at most JUDGE_MAX_BATCH items"
    )


class JudgeVerdict(Verdict):
    """A :class:`~hoprl.judging.Verdict` plus how the service produced it."""

    cached: bool = Field(default=False, description="served from the cache, no backend call")
    fallback: bool = Field(
        default=False, description="the LLM (or, client-side, the judge service) failed and the rules decided"
    )
    fallback_reason: str | None = Field(default=None, description="why the LLM or service verdict is missing")


class VerdictsResponse(BaseModel):
    """Verdicts in the order of the request's items."""

    verdicts: list[JudgeVerdict]
