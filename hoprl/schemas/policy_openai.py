"""Wire models of the policy service's OpenAI-compatible routes (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``); its own routes are :mod:`hoprl.schemas.policy`.

The OpenAI request models follow the official API, so its client and the tools built on it work
unchanged: ``null`` means a parameter's default; a parameter OpenAI lists but this server does not
implement (``tools``, ``response_format``, ``logit_bias`` ...) is accepted only with a value that
asks for nothing (``null``, ``[]``, ``0``, ``"none"`` ...) and is otherwise a 400 naming it, never
silently ignored; a name OpenAI does not know is a 400 too, as OpenAI answers (see
:meth:`_OpenAIRequest.problem`). Those routes answer errors in OpenAI's envelope
(:class:`OpenAIErrorResponse`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.schemas import Bool, json_typed, non_blank
from hoprl.schemas.policy import SEED

Problem = tuple[str, str, str]
"""What is wrong with a request: ``(code, param, message)``, answered as a 400."""

# OpenAI's parameters (openai's types/chat/completion_create_params.py, completion_create_params.py)
# that this server does not implement, each with the values that ask for nothing; null always does.
CHAT_NO_OP: dict[str, tuple[Any, ...]] = {
    "tools": ([],), "tool_choice": ("none",), "parallel_tool_calls": (True, False),
    "functions": ([],), "function_call": ("none",),
    "logit_bias": ({},), "frequency_penalty": (0,), "presence_penalty": (0,), "audio": (),
    "modalities": (["text"],), "prediction": (), "reasoning_effort": (), "verbosity": (),
    "web_search_options": (), "moderation": (), "store": (False,), "echo": (False,),
}  # fmt: skip
COMPLETION_NO_OP: dict[str, tuple[Any, ...]] = {
    "best_of": (1,), "echo": (False,), "logit_bias": ({},), "frequency_penalty": (0,),
    "presence_penalty": (0,), "suffix": ("",),
}  # fmt: skip
MESSAGE_NO_OP: dict[str, tuple[Any, ...]] = {"refusal": (), "audio": (), "function_call": ()}
# Parameters that change nothing in what is generated (end-user ids, cache and billing hints).
HINTS = frozenset(
    {"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
     "service_tier", "metadata"}
)  # fmt: skip


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: false is not 0 (Python's ``False == 0``), 0 and 0.0 are one number."""
    return isinstance(a, bool) == isinstance(b, bool) and type(a) in (type(b), int, float) and a == b


def extra_problem(
    extra: dict[str, Any] | None, no_op: dict[str, tuple[Any, ...]], hints: frozenset[str], at: str = ""
) -> Problem | None:
    """The first field of ``extra`` (the undeclared ones) that asks for something not implemented."""
    for name, value in (extra or {}).items():
        param = f"{at}{name}"
        if name in no_op:
            if value is not None and not any(_json_equal(value, v) for v in no_op[name]):
                allowed = ", ".join(["null", *(json.dumps(v) for v in no_op[name])])
                return (
                    "unsupported_parameter", param,
                    f"'{param}' is not supported by this server; leave it out (accepted: {allowed})",
                )  # fmt: skip
        elif name not in hints:
            return "unrecognized_parameter", param, f"Unrecognized request argument supplied: {param}"
    return None


#: a completion prompt: at least one visible character (longer ones meet POLICY_MAX_PROMPT_CHARS)
PromptText = Annotated[str, non_blank(10**7)]


class StreamOptions(BaseModel):
    include_usage: Bool = False


def _no_ops(no_op: dict[str, tuple[Any, ...]], hints: frozenset[str]) -> Any:
    """``json_schema_extra`` that publishes what :func:`extra_problem` accepts beyond the declared
    fields: each unimplemented parameter with the values that ask for nothing (or null), each hint
    with any value, and nothing else (``additionalProperties: false``)."""

    def extra(schema: dict[str, Any]) -> None:
        properties = schema.setdefault("properties", {})
        for name, prop in properties.items():  # null is any optional parameter's default
            branches = prop.get("anyOf", [prop])
            if name not in schema.get("required", []) and not any(b.get("type") == "null" for b in branches):
                keep = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
                properties[name] = {"anyOf": [prop, {"type": "null"}], **keep}
        for name, values in no_op.items():
            properties.setdefault(name, {"enum": [None, *values], "description": "not implemented: null or "
                                         "a value that asks for nothing"})  # fmt: skip
        for name in sorted(hints):
            properties.setdefault(name, {"description": "a hint; it changes nothing in the output"})
        schema["additionalProperties"] = False

    return extra


class _OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="the served model id (GET /v1/models); None = it")
    temperature: float = Field(1.0, ge=0, le=2, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, description="default: 16 (completions) / 256 (chat)")
    stop: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=8)]
        | None
    ) = Field(None, description="up to 8 non-empty stop strings, cut from the text")
    n: int = Field(1, ge=1)
    seed: int | None = SEED
    stream: bool = Field(False, description="server-sent events, each piece of text as it is decoded")
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """``null`` is a parameter's default, as in OpenAI's API (``"temperature": null``); a number
        or boolean parameter takes JSON's type only (``"n": "2"`` and ``"stream": 0`` are 400s)."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return json_typed(cls, data)

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def problem(self) -> Problem | None:
        """The first parameter this server cannot honour (see the module docstring)."""
        return None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=lambda s: s.update(required=["type", "text"]))

    type: str = Field(description="only 'text' is supported", json_schema_extra={"enum": ["text"]})
    text: str | None = Field(None, json_schema_extra={"type": "string"})


class ToolCallFunction(BaseModel):
    name: str
    arguments: str = Field(description="JSON text, as the model wrote it")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction

    def template(self, parse_arguments: bool) -> dict[str, Any]:
        """The call as a chat template takes it. HF templates expect ``arguments`` as an object (vLLM
        parses them the same way), so with ``parse_arguments`` JSON text of an object is passed parsed;
        an OpenAI-compatible remote takes the text as it is."""
        arguments: Any = self.function.arguments
        if parse_arguments:
            try:
                parsed = json.loads(arguments)
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.function.name, "arguments": arguments},
        }


def _turns_by_role(schema: dict[str, Any]) -> None:
    """The rules of :meth:`ChatMessage.problem` as JSON Schema: content is null only in an assistant
    turn with tool_calls, only assistant turns carry tool_calls, a tool turn names its
    tool_call_id, and the only undeclared fields are OpenAI's no-op ones (null)."""
    properties = schema["properties"]
    # the declared fields' own branches (their $refs follow whichever template the caller uses)
    content = {"anyOf": [b for b in properties["content"]["anyOf"] if b.get("type") != "null"]}
    array = next(b for b in properties["tool_calls"]["anyOf"] if b.get("type") == "array")
    calls = {**array, "minItems": 1}
    properties.update({name: {"type": "null"} for name in MESSAGE_NO_OP})
    schema["additionalProperties"] = False
    no_calls = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}
    user = {"role": {"enum": ["system", "developer", "user"]}, "content": content, "tool_calls": no_calls}
    tool = {
        "role": {"const": "tool"},
        "content": content,
        "tool_calls": no_calls,
        "tool_call_id": {"type": "string", "minLength": 1},
    }
    said = {"role": {"const": "assistant"}, "content": content}
    calling = {"role": {"const": "assistant"}, "content": {"type": "null"}, "tool_calls": calls}
    schema["oneOf"] = [  # services.policy.app drops the tool turns a model's template cannot render
        {"properties": user, "required": ["role", "content"]},
        {"properties": tool, "required": ["role", "content", "tool_call_id"]},
        {"properties": said, "required": ["role", "content"]},
        {"properties": calling, "required": ["role", "tool_calls"]},
    ]  # fmt: skip


class ChatMessage(BaseModel):
    """A chat turn; ``tool`` turns and assistant turns with ``tool_calls`` (content null) included."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_turns_by_role)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(None, description="the call a tool turn answers")

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)

    def template(self, parse_arguments: bool = True) -> dict[str, Any]:
        """The message as the model's chat template takes it (``developer`` is its ``system``)."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        message["content"] = self.text()
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.template(parse_arguments) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

    def problem(self, at: str) -> Problem | None:
        """The first thing in this turn the server cannot take (``at``: its place, ``messages[2]``)."""
        if found := extra_problem(self.model_extra, MESSAGE_NO_OP, frozenset(), f"{at}."):
            return found
        parts = self.content if isinstance(self.content, list) else []
        null_content = self.content is None and not (self.role == "assistant" and self.tool_calls)
        checks: list[tuple[bool, str, str, str]] = [
            *((p.type != "text", "unsupported_parameter", f"{at}.content[{j}].type",
               f"only text content parts are supported, not {p.type!r}") for j, p in enumerate(parts)),
            *((p.text is None, "invalid_value", f"{at}.content[{j}].text", "a text part needs its text")
              for j, p in enumerate(parts)),
            (null_content, "invalid_value", f"{at}.content",
             "content may be null only in an assistant turn with tool_calls"),
            (bool(self.tool_calls) and self.role != "assistant", "invalid_value", f"{at}.tool_calls",
             "only assistant turns carry tool_calls"),
            (self.role == "tool" and not self.tool_call_id, "missing_required_parameter",
             f"{at}.tool_call_id", "a tool turn needs the tool_call_id it answers"),
        ]  # fmt: skip
        return next(((code, param, message) for bad, code, param, message in checks if bad), None)


class JsonSchema(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="JSON Schema; None = any JSON")
    strict: Bool | None = Field(None, description="ignored: the schema is always enforced")


def _schema_with_json_schema(schema: dict[str, Any]) -> None:
    """type json_schema needs its json_schema (JSON Schema if/then, as :meth:`_schema_given`)."""
    schema["if"] = {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]}
    schema["then"] = {"properties": {"json_schema": {"type": "object"}}, "required": ["json_schema"]}


class ResponseFormat(BaseModel):
    """``text``, or JSON (any object, or one that follows ``json_schema``) enforced while decoding."""

    model_config = ConfigDict(json_schema_extra=_schema_with_json_schema)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema (its name and schema)")
        return self

    def grammar(self) -> str | None:
        """The Lark grammar the engine decodes under (llguidance's ``%json`` takes a JSON Schema)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return 'start: %json {"type": "object"}'
        return "start: %json " + json.dumps((self.json_schema and self.json_schema.schema_) or {})


class ChatCompletionRequest(_OpenAIRequest):
    """OpenAI's chat completion request; unimplemented parameters are a 400 unless they ask for nothing."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_no_ops(CHAT_NO_OP, HINTS))

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="the newer name of max_tokens")
    logprobs: bool = Field(False, description="with stream, the chunks are sent once decoding ends")
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = Field(None, description="JSON output, enforced while decoding")

    def problem(self) -> Problem | None:
        for i, message in enumerate(self.messages):
            if found := message.problem(f"messages[{i}]"):
                return found
        return extra_problem(self.model_extra, CHAT_NO_OP, HINTS)


class CompletionRequest(_OpenAIRequest):
    """OpenAI's legacy completion request; unimplemented parameters are a 400 unless they ask for nothing."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_no_ops(COMPLETION_NO_OP, HINTS))

    prompt: PromptText | Annotated[list[PromptText], Field(min_length=1)] = Field(
        description="one prompt, or a batch of prompts (text, not token ids), each with a visible character"
    )
    logprobs: int | None = Field(None, ge=0, le=5, description="return the top-k log-probs per token")

    def problem(self) -> Problem | None:
        return extra_problem(self.model_extra, COMPLETION_NO_OP, HINTS)


class OpenAIError(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error, authentication_error, permission_error, rate_limit_error "
        "or server_error"
    )
    param: str | None = Field(None, description="the request field at fault, e.g. 'messages[0].role'")
    code: str | None = Field(None, description="machine-readable, e.g. 'model_not_found'")


class OpenAIErrorResponse(BaseModel):
    """The error body of the OpenAI-compatible routes: OpenAI's envelope, which the official client
    reads into ``e.message``, ``e.code``, ``e.param`` and ``e.type``."""

    error: OpenAIError


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
