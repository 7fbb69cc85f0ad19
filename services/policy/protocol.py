"""Wire models of the policy service: the OpenAI-compatible subset, ``/v1/answer`` and ``/v1/rollouts``.

The OpenAI request models ignore fields they do not know (``user``, ``frequency_penalty`` ...), as
OpenAI-compatible servers do, so the official client works unchanged; the project's own requests
forbid unknown fields so a misspelt option fails loudly.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hoprl.agent.trajectory import Episode, Outcome, Step, TokenTrajectory
from hoprl.schemas import Question, SearchMode

SEED = Field(None, ge=0, le=2**63 - 1, description="same seed, same request -> same output")


class StreamOptions(BaseModel):
    include_usage: bool = False


class _OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="the served model id (GET /v1/models); None = it")
    temperature: float = Field(1.0, ge=0, le=2, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, description="default: 16 (completions) / 256 (chat)")
    stop: str | list[str] | None = Field(None, description="up to 8 stop strings, cut from the text")
    n: int = Field(1, ge=1)
    seed: int | None = SEED
    stream: bool = False
    stream_options: StreamOptions | None = None

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class TextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="the newer name of max_tokens")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[str] = Field(description="one prompt, or a batch of prompts")
    logprobs: int | None = Field(None, ge=0, le=5, description="return the top-k log-probs per token")
    echo: Literal[False] = False


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str
    stop_reason: str | None = Field(None, description="the matched stop string (vLLM's field)")


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str
    stop_reason: str | None = Field(None, description="the matched stop string (vLLM's field)")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hoprl"
    root: str = Field(description="the checkpoint path or HF id the engine loaded")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- the project's own routes -----------------------------------------------------------------------


class AnswerRequest(BaseModel):
    """A question for the agent; unset fields take the service's defaults (POLICY_DEFAULT_*)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(description="the question, 1 to POLICY_MAX_QUESTION_CHARS characters")
    recipe: str | None = Field(None, description="e.g. naive-rag, search-r1; default POLICY_DEFAULT_RECIPE")
    collection: str | None = Field(
        None, description="retriever collection; default POLICY_DEFAULT_COLLECTION"
    )
    max_steps: int | None = Field(None, ge=1, description="agent steps at most (<= POLICY_MAX_STEPS)")
    return_trace: bool = Field(False, description="include every step: text, queries, documents")


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


class RolloutSampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(128, ge=1, description="new tokens per step (<= POLICY_MAX_TOKENS_PER_STEP)")
    max_steps: int = Field(4, ge=1, description="<= POLICY_MAX_STEPS")
    token_budget: int | None = Field(None, ge=1, description="default and cap POLICY_TOKEN_BUDGET")
    seed: int | None = SEED
    search_mode: SearchMode = "hybrid"


class RolloutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    questions: list[Question] = Field(min_length=1, description="common-schema questions")
    recipe: str
    n_samples: int = Field(1, ge=1, description="episodes per question (a GRPO group)")
    collection: str
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


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    """One server-sent event line: ``data: {...}`` (or ``data: [DONE]``)."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n"
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else _json(payload)
    return f"data: {body}\n\n"


def _json(payload: dict[str, Any]) -> str:
    import json

    return json.dumps(payload, separators=(",", ":"))
