"""Wire models of the policy service's own routes: ``/v1/answer``, ``/v1/answer/batch``,
``/v1/rollouts`` and ``/v1/admin/checkpoint``. The OpenAI-compatible routes' models are
:mod:`hoprl.schemas.policy_openai`.

The requests forbid unknown fields. The service validates requests with these models and documents
them in its OpenAPI; :class:`hoprl.clients.policy.PolicyClient` parses the replies with the same classes.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.domain import (
    RECIPE_NAMES,
    Episode,
    EpisodeShape,
    Outcome,
    Paragraph,
    Question,
    Step,
    TokenTrajectory,
)
from hoprl.schemas import MAX_JSON_INT, json_typed, non_blank
from hoprl.schemas.retriever import CollectionName

#: the most characters in a question (POLICY_MAX_QUESTION_CHARS may lower it; the service publishes
#: its own value in its OpenAPI document)
MAX_QUESTION_CHARS = 2_000
QuestionText = Annotated[str, non_blank(MAX_QUESTION_CHARS)]
#: the recipe whose prompt reads a request's ``paragraphs`` (its numbered references)
PARAGRAPH_RECIPES = ("arena",)


def _recipe_names(schema: dict[str, Any]) -> None:
    """The recipes as an enum in the OpenAPI document (the registry's names: hoprl.domain.RECIPE_NAMES)."""
    branch = next(b for b in schema["anyOf"] if b.get("type") == "string") if "anyOf" in schema else schema
    branch["enum"] = sorted(RECIPE_NAMES)


def _paragraphs_need_their_recipe(schema: dict[str, Any]) -> None:
    """Paragraphs only with a recipe that reads them, named in the request (JSON Schema if/then)."""
    schema["if"] = {"properties": {"paragraphs": {"minItems": 1}}, "required": ["paragraphs"]}
    schema["then"] = {"properties": {"recipe": {"enum": list(PARAGRAPH_RECIPES)}}, "required": ["recipe"]}


SEED = Field(
    None, ge=0, le=MAX_JSON_INT, description="same seed, same request -> same output; 0 to 2**53 - 1"
)


class AnswerRequest(BaseModel):
    """A question for the agent; unset fields take the service's defaults (POLICY_DEFAULT_*).

    ``paragraphs`` are used, never dropped: only a recipe whose prompt reads them (ARENA: its
    numbered references) takes them, and the request must name it; any other recipe searches its
    collection, so paragraphs with it are a 422 naming the recipe (the published schema says so
    with an if/then)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_paragraphs_need_their_recipe)

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        return json_typed(cls, data)

    @model_validator(mode="after")
    def _paragraphs_used(self) -> AnswerRequest:
        if self.paragraphs and self.recipe not in PARAGRAPH_RECIPES:
            named = f"recipe {self.recipe!r}" if self.recipe else "the default recipe (POLICY_DEFAULT_RECIPE)"
            raise ValueError(
                f"paragraphs are read only by {', '.join(PARAGRAPH_RECIPES)} (its numbered references); "
                f"{named} searches its collection and would ignore them: name recipe 'arena', or leave "
                "paragraphs out"
            )
        return self

    question: QuestionText = Field(description="the question, 1 to POLICY_MAX_QUESTION_CHARS characters")
    recipe: str | None = Field(
        None, description="e.g. naive-rag, search-r1; default POLICY_DEFAULT_RECIPE",
        json_schema_extra=_recipe_names,
    )  # fmt: skip
    collection: CollectionName | None = Field(
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
        description="the question's own references, for the recipe that answers over them (ARENA, named "
        "in the request); with any other recipe a 422. The question and these count against "
        "POLICY_MAX_PROMPT_CHARS",
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

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        return json_typed(cls, data)

    questions: list[QuestionText] = Field(
        min_length=1, description="1 to POLICY_MAX_ROLLOUTS questions, each as AnswerRequest.question"
    )
    recipe: str | None = Field(
        None, description="e.g. naive-rag, search-r1; default POLICY_DEFAULT_RECIPE",
        json_schema_extra=_recipe_names,
    )  # fmt: skip
    collection: CollectionName | None = Field(
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


class RolloutShape(EpisodeShape):
    """A rollout's episode shape: an :class:`~hoprl.domain.EpisodeShape` published with this
    service's limits (POLICY_MAX_STEPS, POLICY_MAX_NEW_TOKENS_PER_STEP, POLICY_TOKEN_BUDGET), which a
    rollout over them is refused by (an answer's shape is lowered to them instead)."""


class RolloutSampling(BaseModel):
    """How rollouts are sampled: the run's episode shape (never a default: a training run's own) and
    the sampling choices beside it."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        return json_typed(cls, data)

    shape: RolloutShape = Field(
        description="steps (<= POLICY_MAX_STEPS), tokens a step (<= POLICY_MAX_NEW_TOKENS_PER_STEP), budget "
        "(<= POLICY_TOKEN_BUDGET), temperature, search mode; rollouts are never grammar-constrained"
    )
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = SEED


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        return json_typed(cls, data)

    questions: list[Question] = Field(min_length=1, description="common-schema questions")
    recipe: str = Field(json_schema_extra=_recipe_names)
    n_samples: int = Field(1, ge=1, description="episodes per question (a GRPO group)")
    collection: CollectionName
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
