"""Wire models of the policy service's own routes: ``/v1/answer``, ``/v1/answer/batch``,
``/v1/rollouts`` and ``/v1/admin/checkpoint``. The OpenAI-compatible routes' models are
:mod:`hoprl.schemas.policy_openai`.

The requests forbid unknown fields. The service validates requests with these models and documents
them in its OpenAPI; :class:`hoprl.clients.policy.PolicyClient` parses the replies with the same classes.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.agent.trajectory import Episode, Outcome, Step, TokenTrajectory
from hoprl.schemas import MAX_JSON_INT, Paragraph, Question, json_typed, non_blank
from hoprl.schemas.retriever import CollectionName, SearchMode

#: the most characters in a question (POLICY_MAX_QUESTION_CHARS may lower it; the service publishes
#: its own value in its OpenAPI document)
MAX_QUESTION_CHARS = 2_000
QuestionText = Annotated[str, non_blank(MAX_QUESTION_CHARS)]
#: the recipe whose prompt reads a request's ``paragraphs`` (its numbered references)
PARAGRAPH_RECIPES = ("arena",)


def _recipe_names(schema: dict[str, Any]) -> None:
    """The recipes as an enum in the OpenAPI document, imported only when the document is built
    (the recipes pull in torch; the clients import this module)."""
    from hoprl.recipes import RECIPES

    branch = next(b for b in schema["anyOf"] if b.get("type") == "string") if "anyOf" in schema else schema
    branch["enum"] = sorted(RECIPES)


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
    max_steps: int | None = Field(
        None, ge=1, description="agent steps at most (<= POLICY_MAX_STEPS); default POLICY_DEFAULT_MAX_STEPS"
    )
    return_trace: bool = Field(False, description="include every step: text, queries, documents")
    constrained: bool | None = Field(
        None, description="decode under the recipe's action grammar; default POLICY_CONSTRAINED_DECODING"
    )
    temperature: float = Field(0.0, ge=0, le=2, description="0 = greedy (default); R2AG evaluates at 0.6")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling; R2AG evaluates at 0.9")
    seed: int | None = SEED
    paragraphs: list[Paragraph] = Field(
        default_factory=list,
        description="the question's own references, for the recipe that answers over them (ARENA, named "
        "in the request); with any other recipe a 422. The question and these count against "
        "POLICY_MAX_PROMPT_CHARS",
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
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        return json_typed(cls, data)

    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(
        128, ge=1, description="new tokens per step (<= POLICY_MAX_TOKENS_PER_STEP; unset: 128 or that limit)"
    )
    max_steps: int = Field(4, ge=1, description="<= POLICY_MAX_STEPS; unset: 4 or that limit")
    token_budget: int | None = Field(None, ge=1, description="default and cap POLICY_TOKEN_BUDGET")
    seed: int | None = SEED
    search_mode: SearchMode = "hybrid"


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
    sampling: RolloutSampling = Field(default_factory=RolloutSampling)


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
