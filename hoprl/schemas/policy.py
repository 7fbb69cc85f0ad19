"""Wire models of the policy service's own routes: ``/v1/answer``, ``/v1/answer/batch``,
``/v1/rollouts`` and ``/v1/admin/checkpoint``. The OpenAI-compatible routes' models are
:mod:`hoprl.schemas.policy_openai`.

The requests forbid unknown fields. The service validates requests with these models and documents
them in its OpenAPI; :class:`hoprl.clients.policy.PolicyClient` parses the replies with the same classes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hoprl.domain import Episode, EpisodeShape, Outcome, Paragraph, Question, Step, TokenTrajectory

SEED = Field(None, ge=0, le=2**63 - 1, description="same seed, same request -> same output")


class AnswerRequest(BaseModel):
    """A question for the agent; unset fields take the service's defaults (POLICY_DEFAULT_*)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(description="the question, 1 to POLICY_MAX_QUESTION_CHARS characters")
    recipe: str | None = Field(None, description="e.g. naive-rag, search-r1; default POLICY_DEFAULT_RECIPE")
    collection: str | None = Field(
        None, description="retriever collection; default POLICY_DEFAULT_COLLECTION"
    )
    shape: EpisodeShape | None = Field(
        None,
        description="the episode's shape (a paper protocol's: steps, tokens a step, budget, temperature, "
        "documents a search, grammar); unset: the service's (POLICY_DEFAULT_MAX_STEPS, "
        "POLICY_MAX_NEW_TOKENS_PER_STEP, POLICY_TOKEN_BUDGET, POLICY_CONSTRAINED_DECODING). Values above the "
        "service's limits are lowered to them, and the response's `limited` says which",
    )
    max_steps: int | None = Field(
        None, ge=1, description="agent steps at most (<= POLICY_MAX_STEPS); over the shape's"
    )
    return_trace: bool = Field(False, description="include every step: text, queries, documents")
    constrained: bool | None = Field(
        None, description="decode under the recipe's action grammar, over the shape's grammar"
    )
    temperature: float = Field(
        0.0,
        ge=0,
        le=2,
        description="0 = greedy (default); R2AG evaluates at 0.6; when sent, over the shape's",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling; R2AG evaluates at 0.9")
    seed: int | None = SEED
    paragraphs: list[Paragraph] = Field(
        default_factory=list,
        description="the question's own references, for recipes that answer over them (ARENA); the "
        "question and these count against POLICY_MAX_PROMPT_CHARS",
    )
    recipe_config: dict[str, Any] = Field(
        default_factory=dict,
        description="the recipe's options for this answer, as its config names them (e.g. R2AG's "
        "top_k and top_t at evaluation); an unknown option or value is a 422",
    )


class Citation(BaseModel):
    doc_id: str
    title: str


class Timings(BaseModel):
    retrieval_s: float
    generation_s: float
    total_s: float


class AnswerResponse(BaseModel):
    answer: str | None = Field(description="None when the agent refused or ended without an answer")
    refused: bool
    citations: list[Citation] = Field(description="every retrieved document, de-duplicated, in order")
    steps: list[Step] | None = Field(None, description="the trace, when return_trace was set")
    timings: Timings
    recipe: str
    outcome: Outcome
    model: str
    constrained: bool = Field(False, description="every step was decoded under the recipe's action grammar")
    grammar: str | None = Field(None, description="that grammar's name and version, e.g. search-r1@1")
    shape: EpisodeShape | None = Field(None, description="the episode's shape as it ran, after the limits")
    limited: list[str] = Field(
        default_factory=list,
        description="each value of the requested shape the service's limits lowered, e.g. "
        "'max_new_tokens_per_step 4096 -> 256 (POLICY_MAX_NEW_TOKENS_PER_STEP)'",
    )


class AnswerBatchRequest(BaseModel):
    """Questions answered together in lock-step rounds (greedy, repeatable); the other fields
    apply to every question, as in :class:`AnswerRequest`."""

    model_config = ConfigDict(extra="forbid")

    questions: list[str] = Field(
        min_length=1, description="1 to POLICY_MAX_ROLLOUTS questions, each as AnswerRequest.question"
    )
    recipe: str | None = Field(None, description="e.g. naive-rag, search-r1; default POLICY_DEFAULT_RECIPE")
    collection: str | None = Field(
        None, description="retriever collection; default POLICY_DEFAULT_COLLECTION"
    )
    shape: EpisodeShape | None = Field(
        None,
        description="the episode's shape, as AnswerRequest.shape; decoded greedily whatever its temperature",
    )
    max_steps: int | None = Field(None, ge=1, description="agent steps at most (<= POLICY_MAX_STEPS)")
    return_trace: bool = Field(False, description="include every step: text, queries, documents")
    constrained: bool | None = Field(
        None, description="decode under the recipe's action grammar; default POLICY_CONSTRAINED_DECODING"
    )


class AnswerBatchResponse(BaseModel):
    answers: list[AnswerResponse] = Field(description="one per question, in the request's order")
    rounds: int = Field(description="lock-step rounds decoded (each: every live episode's next turn)")
    took_s: float


class RolloutSampling(BaseModel):
    """How rollouts are sampled: the run's episode shape (never a default: a training run's own) and
    the sampling choices beside it."""

    model_config = ConfigDict(extra="forbid")

    shape: EpisodeShape = Field(
        description="steps (<= POLICY_MAX_STEPS), tokens a step (<= POLICY_MAX_NEW_TOKENS_PER_STEP), budget "
        "(<= POLICY_TOKEN_BUDGET), temperature, search mode; rollouts are never grammar-constrained"
    )
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = SEED


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    questions: list[Question] = Field(min_length=1, description="common-schema questions")
    recipe: str
    n_samples: int = Field(1, ge=1, description="episodes per question (a GRPO group)")
    collection: str
    sampling: RolloutSampling


class Rollout(BaseModel):
    episode: Episode
    trajectory: TokenTrajectory


class RolloutResponse(BaseModel):
    recipe: str
    model: str
    rollouts: list[Rollout] = Field(description="question-major: a question's samples are contiguous")
    took_s: float


class CheckpointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="a checkpoint folder on the service's machine")


class CheckpointResponse(BaseModel):
    model: str
    root: str
    took_s: float
