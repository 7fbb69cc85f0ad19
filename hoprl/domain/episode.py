"""One data model for an episode, its steps and actions, and its token-level form for training.

An :class:`Episode` is what happened (steps, retrieved documents, the final answer); an
:class:`Action` is what one generated segment asks the runner to do next; a :class:`Completion`
is one generated choice of a model; a :class:`TokenTrajectory` is what the trainer sees: prompt
ids, completion ids and a mask that is 1 for tokens the policy generated and 0 for injected text
(retrieved ``<information>``), which never enters a loss, a KL term or a per-token reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

ActionKind = Literal[
    "search",  # one or more queries to the retriever
    "backtrack",  # EVO-RAG: drop the last hop's query and evidence
    "answer",
    "refuse",  # EVO-RAG: the question is declared unanswerable
    "stop",  # R2AG: `<base-Q>stop retrieval</base-Q>`
    "format_error",  # the segment could not be parsed: a recorded outcome, never a crash
]

Outcome = Literal["answer", "refuse", "stop", "step_cap", "token_budget", "format_error", "timeout"]
#: outcomes of an episode cut before the recipe's own ending, reported per phase as ``ended/<name>``
CUT_OUTCOMES = ("token_budget", "format_error", "step_cap")


def cut_shares(outcomes: list[str]) -> dict[str, float]:
    """The share of episodes that ended on each :data:`CUT_OUTCOMES` (0.0 each without episodes).

    >>> cut_shares(["answer", "token_budget", "format_error", "answer"])
    {'ended/token_budget': 0.25, 'ended/format_error': 0.25, 'ended/step_cap': 0.0}
    """
    n = max(len(outcomes), 1)
    return {f"ended/{name}": outcomes.count(name) / n for name in CUT_OUTCOMES}


def ended_shares(outcomes: list[str]) -> dict[str, float]:
    """:func:`cut_shares` and ``ended/answer``, the share that ended on an answer: how a training
    step's episodes ended (the other recipe endings, ``refuse`` and ``stop``, are the remainder).

    >>> ended_shares(["answer", "token_budget", "refuse", "answer"])["ended/answer"]
    0.5
    """
    return {"ended/answer": outcomes.count("answer") / max(len(outcomes), 1)} | cut_shares(outcomes)


@dataclass
class Action:
    """What the runner does next, parsed from one generated segment."""

    kind: ActionKind
    queries: list[str] = field(default_factory=list)
    query_kinds: list[str] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None


@dataclass
class Completion:
    """One generated choice of a model.

    ``stop`` is the stop text re-appended to ``text`` (``None``: nothing appended; see
    :mod:`hoprl.clients.llm`); ``logprobs`` holds one ``(token, logprob)`` per generated token when
    asked for; ``usage`` is the response's ``prompt_tokens`` / ``completion_tokens`` (for all ``n``
    choices together).
    """

    text: str
    finish_reason: str | None
    stop: str | None = None
    logprobs: list[tuple[str, float]] | None = None
    usage: dict[str, int] = field(default_factory=dict)


class RetrievedDoc(BaseModel):
    id: str
    title: str
    text: str
    score: float = 0.0


class Step(BaseModel):
    """One policy turn: the text it generated, the action parsed from it, what came back."""

    t: int = Field(ge=1, description="1-based step index")
    action: ActionKind
    text: str = Field(description="the policy's generated text for this step (mask 1)")
    queries: list[str] = Field(default_factory=list)
    query_kinds: list[str] = Field(
        default_factory=list, description="per query: 'search', or R2AG's 'base' / 'predicted'"
    )
    docs: list[list[RetrievedDoc]] = Field(
        default_factory=list, description="per query, the retrieved documents in rank order"
    )
    information: str = Field(default="", description="injected text after the step (mask 0)")
    answer: str | None = None
    signals: dict[str, float] = Field(default_factory=dict, description="per-step reward signals")
    error: str | None = None

    @model_validator(mode="after")
    def _kinds_match(self) -> Step:
        if self.query_kinds and len(self.query_kinds) != len(self.queries):
            raise ValueError("query_kinds must have one entry per query")
        return self


class Episode(BaseModel):
    """A whole episode of one recipe on one question."""

    recipe: str
    question_id: str
    question: str
    answers: list[str] = Field(default_factory=list, description="gold answers (empty: unanswerable)")
    gold_titles: list[str] = Field(default_factory=list)
    prompt: list[dict[str, str]] = Field(default_factory=list, description="chat messages before step 1")
    steps: list[Step] = Field(default_factory=list)
    final_answer: str | None = None
    refused: bool = False
    outcome: Outcome = "answer"
    sample: int = 0
    timings: dict[str, float] = Field(default_factory=dict, description="seconds: retrieval, generation")
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def queries(self) -> list[str]:
        return [q for s in self.steps for q in s.queries]

    @property
    def retrieval_count(self) -> int:
        """Number of retriever calls (one per query)."""
        return len(self.queries)

    @property
    def retrieved_titles(self) -> list[str]:
        """Titles of every retrieved document, in retrieval order, de-duplicated."""
        seen: dict[str, None] = {}
        for s in self.steps:
            for docs in s.docs:
                for d in docs:
                    seen.setdefault(d.title, None)
        return list(seen)

    def completion_text(self) -> str:
        """Generated and injected text in order, as the policy saw it."""
        return "".join(s.text + s.information for s in self.steps)


class TokenTrajectory(BaseModel):
    """Token-level form of an episode for training."""

    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int] = Field(description="per completion token: 1 policy-generated, 0 injected")
    logprobs: list[float] | None = Field(default=None, description="per completion token (0.0 where mask 0)")

    @model_validator(mode="after")
    def _aligned(self) -> TokenTrajectory:
        if len(self.mask) != len(self.completion_ids):
            raise ValueError(f"mask has {len(self.mask)} entries for {len(self.completion_ids)} tokens")
        if any(m not in (0, 1) for m in self.mask):
            raise ValueError("mask entries must be 0 or 1")
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids):
            raise ValueError("logprobs must have one entry per completion token")
        return self
