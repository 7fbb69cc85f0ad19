"""The OpenAI-compatible routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

The official ``openai`` client is the reference:

- errors carry OpenAI's envelope ``{"error": {"message", "type", "param", "code"}}``
  (:class:`OpenAIRoute`), and a request OpenAI would call invalid is a 400 (never a 422);
- a parameter this server does not implement is a 400 naming it (:mod:`hoprl.schemas.policy_openai`);
- ``stream: true`` answers server-sent events, ``data: {chunk}`` lines and a final ``data: [DONE]``,
  sent as the text is decoded: the transformers engine hands each choice's new text over from its
  decoding loop (``SamplingParams.on_text``), holding back only what may begin a stop string. The
  vLLM and OpenAI engines do not stream, so their text arrives in one chunk when decoding ends; so
  does a stream that asks for ``logprobs`` (its chunks carry per-token log-probs, known at the end).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse
from jinja2 import TemplateError
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from hoprl.generation.engines import Generation, Prompt, SamplingParams
from hoprl.schemas.policy_openai import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    TokenLogprob,
    TopLogprob,
    Usage,
    _OpenAIRequest,
)
from services.errors import ApiError, state_of
from services.policy.agent import Policy
from services.policy.openai_errors import OPENAI_ERRORS, OpenAIRoute
from services.policy.settings import PolicySettings
from services.policy.streaming import Chunks, LiveStream, replay

SSE_RESPONSE: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {}}}}
# /v1/models can only fail as any route can; the generation routes add their own errors.
openai_router = APIRouter(route_class=OpenAIRoute, responses={"4XX": OPENAI_ERRORS["4XX"]})
GENERATION_RESPONSES = SSE_RESPONSE | OPENAI_ERRORS


def generation_route(path: str, operation_id: str, response_model: type[BaseModel]) -> Any:
    """``POST path``: a generation route, answering ``response_model``, an SSE stream or OpenAI's errors."""
    return openai_router.post(
        path, operation_id=operation_id, response_model=response_model, responses=GENERATION_RESPONSES
    )


# -- shared request handling -----------------------------------------------------------------------


# the policy the lifespan loaded (async: with every thread decoding, a request still reaches its 429 at once)
policy_of = state_of("policy", "the model is still loading", {"model": False})


PolicyDep = Annotated[Policy, Depends(policy_of)]


def _bad(code: str, message: str, param: str | None) -> ApiError:
    return ApiError(400, code, message, {"param": param})


def _check(policy: Policy, body: _OpenAIRequest) -> str:
    """Reject what the server cannot honour; the model id to answer with."""
    if found := body.problem():
        code, param, message = found
        raise _bad(code, message, param)
    if body.model not in (None, policy.model_id, policy.engine.model_path):
        raise ApiError(
            404, "model_not_found",
            f"The model {body.model!r} does not exist here; this service serves {policy.model_id!r}",
            {"param": "model"},
        )  # fmt: skip
    return policy.model_id


def _sampling(
    s: PolicySettings, body: _OpenAIRequest, max_tokens: int | None, default: int
) -> SamplingParams:
    """Validate the common OpenAI parameters against the service limits."""
    tokens = max_tokens or min(default, s.max_tokens)
    if tokens > s.max_tokens:
        message = f"max_tokens={tokens} exceeds {s.max_tokens} (POLICY_MAX_TOKENS)"
        raise _bad("max_tokens_too_large", message, "max_tokens")
    if body.n > s.max_n:
        raise _bad("n_too_large", f"n={body.n} exceeds {s.max_n} (POLICY_MAX_N)", "n")
    stop = body.stops()
    if len(stop) > 8 or any(not x for x in stop):
        raise _bad("invalid_stop", "stop takes at most 8 non-empty strings", "stop")
    return SamplingParams(
        max_tokens=tokens, temperature=body.temperature, top_p=body.top_p, n=body.n, stop=stop, seed=body.seed
    )


def _chars(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m.get("content") or "") + len(json.dumps(m.get("tool_calls") or "")) for m in prompt)


def check_tools_render(policy: Policy, messages: list[dict[str, Any]]) -> None:
    """A template that cannot render tool turns, or drops them silently, is a 400 naming the model."""
    tokenizer = policy.engine.tokenizer
    calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls", ())]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if policy.settings.engine == "openai" or tokenizer is None or not calls + results:
        return  # a remote server renders the turns itself
    name = f"the chat template of {policy.engine.model_path!r}"
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja raises whatever the template does (TypeError, UndefinedError ...)
        raise _bad("unsupported_messages", f"{name} cannot render tool calls: {exc}", "messages") from None
    if missing := [x for x in calls + results if x not in text]:
        raise _bad("unsupported_messages", f"{name} drops tool calls or results: {missing}", "messages")


async def _generate(
    policy: Policy, prompts: Sequence[Prompt], params: SamplingParams
) -> list[list[Generation]]:
    """Run the engine off the event loop; a prompt it cannot take is a 400 naming why."""
    chars = sum(_chars(p) for p in prompts)
    if chars > policy.settings.max_prompt_chars:
        limit = policy.settings.max_prompt_chars
        message = f"the prompt has {chars} characters; the limit is {limit} (POLICY_MAX_PROMPT_CHARS)"
        raise _bad("prompt_too_long", message, "messages" if not isinstance(prompts[0], str) else "prompt")
    deadline = time.monotonic() + policy.settings.request_timeout_s
    params = replace(params, deadline=deadline)
    with policy.admitted():
        try:
            return await run_in_threadpool(policy.engine.generate, prompts, params)
        except (ValueError, TemplateError) as exc:  # e.g. a prompt too long, a JSON schema llguidance refuses
            raise _bad("invalid_prompt", str(exc), None) from None


def _usage(gens: list[Generation], prompts: int) -> Usage:
    prompt = sum(g.prompt_tokens for g in gens[:: max(1, len(gens) // prompts)])
    completion = sum(len(g.token_ids) for g in gens)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _usage_chunk(body: _OpenAIRequest, prompts: int) -> Callable[[list[Generation]], dict[str, Any]] | None:
    """The closing chunk's usage, when the request asks for it (``stream_options.include_usage``)."""
    if not (body.stream_options and body.stream_options.include_usage):
        return None
    return lambda gens: _usage(gens, prompts).model_dump()


async def _stream(
    policy: Policy,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    chunks: Chunks,
    logprobs: Callable[[Generation], dict[str, Any] | None] | None = None,
) -> StreamingResponse:
    """``stream: true``: the text live as decoded, or replayed once decoding ends when the request
    asks for log-probs (``logprobs`` puts them on each replayed piece)."""
    if not params.logprobs:
        live = await LiveStream.start(
            lambda on_text: _generate(policy, prompts, replace(params, on_text=on_text))
        )
        return StreamingResponse(live.events(chunks, len(prompts) * params.n), media_type="text/event-stream")
    gens = [g for group in await _generate(policy, prompts, params) for g in group]
    return StreamingResponse(replay(chunks, gens, logprobs), media_type="text/event-stream")


# -- routes --------------------------------------------------------------------------------------


@openai_router.get("/v1/models", operation_id="list_models")
def list_models(policy: PolicyDep) -> ModelList:
    card = ModelCard(id=policy.model_id, created=int(time.time()), root=policy.engine.model_path)
    return ModelList(data=[card])


@generation_route("/v1/chat/completions", "chat_completions", ChatCompletionResponse)
async def chat_completions(body: ChatCompletionRequest, policy: PolicyDep) -> Any:
    """OpenAI chat completions: the model's chat template, then sampling (``stream`` for SSE)."""
    model = _check(policy, body)
    if body.max_completion_tokens and body.max_tokens:  # both given: each within the limit, the newer wins
        _sampling(policy.settings, body, body.max_tokens, 256)
    params = _sampling(policy.settings, body, body.max_completion_tokens or body.max_tokens, 256)
    top = body.top_logprobs or 0
    grammar = body.response_format.grammar() if body.response_format else None
    if grammar is not None and not policy.engine.constrains:
        message = f"the {policy.settings.engine} engine cannot constrain decoding to JSON"
        raise _bad("unsupported_parameter", message, "response_format")
    params = replace(params, logprobs=body.logprobs, top_logprobs=top, grammar=grammar)
    messages = [m.template(parse_arguments=policy.settings.engine == "transformers") for m in body.messages]
    check_tools_render(policy, messages)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        chunks = Chunks(head, _chat_piece, _chat_end, _chat_opening, _usage_chunk(body, 1))
        return await _stream(policy, [messages], params, chunks, partial(_piece_logprobs, top=top))
    (gens,) = await _generate(policy, [messages], params)
    choices = [
        ChatChoice(
            index=i,
            message=AssistantMessage(content=g.text),
            finish_reason=g.finish_reason,
            stop_reason=g.stop_reason,
            logprobs=_chat_logprobs(g, top) if body.logprobs else None,
        )
        for i, g in enumerate(gens)
    ]
    usage = _usage(gens, 1)
    return ChatCompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)


@generation_route("/v1/completions", "completions", CompletionResponse)
async def completions(body: CompletionRequest, policy: PolicyDep) -> Any:
    """OpenAI (legacy) text completions: the prompt as raw text, no chat template."""
    model = _check(policy, body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts or not all(p.strip() for p in prompts):
        raise _bad("empty_prompt", "every prompt needs at least one non-blank character", "prompt")
    params = _sampling(policy.settings, body, body.max_tokens, 16)
    if len(prompts) * body.n > policy.settings.max_n:
        raise _bad("n_too_large", f"prompts x n exceeds {policy.settings.max_n} (POLICY_MAX_N)", "n")
    top = body.logprobs or 0
    params = replace(params, logprobs=body.logprobs is not None, top_logprobs=top)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        chunks = Chunks(head, _completion_piece, _completion_end, usage=_usage_chunk(body, len(prompts)))
        return await _stream(policy, prompts, params, chunks)
    gens = [g for group in await _generate(policy, prompts, params) for g in group]
    choices = [
        CompletionChoice(
            index=i,
            text=g.text,
            finish_reason=g.finish_reason,
            stop_reason=g.stop_reason,
            logprobs=_completion_logprobs(g, top) if body.logprobs is not None else None,
        )
        for i, g in enumerate(gens)
    ]
    usage = _usage(gens, len(prompts))
    return CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)


# -- chunks --------------------------------------------------------------------------------------


def _chat_opening(i: int) -> dict[str, Any]:
    return {"index": i, "delta": {"role": "assistant", "content": ""}}


def _chat_piece(i: int, text: str) -> dict[str, Any]:
    return {"index": i, "delta": {"content": text}, "logprobs": None, "finish_reason": None}


def _chat_end(i: int, g: Generation) -> dict[str, Any]:
    end = {"index": i, "delta": {}, "logprobs": None}
    return end | {"finish_reason": g.finish_reason, "stop_reason": g.stop_reason}


def _completion_piece(i: int, text: str) -> dict[str, Any]:
    return {"index": i, "text": text, "logprobs": None, "finish_reason": None}


def _completion_end(i: int, g: Generation) -> dict[str, Any]:
    end = {"index": i, "text": "", "logprobs": None}
    return end | {"finish_reason": g.finish_reason, "stop_reason": g.stop_reason}


# -- log-probs ---------------------------------------------------------------------------------


def _chat_logprobs(g: Generation, top: int) -> ChatLogprobs | None:
    if g.logprobs is None:
        return None
    tops = g.top_logprobs or [{} for _ in g.logprobs]
    return ChatLogprobs(
        content=[
            TokenLogprob(
                token=t,
                logprob=lp,
                bytes=list(t.encode()),
                top_logprobs=[TopLogprob(token=k, logprob=v, bytes=list(k.encode())) for k, v in d.items()][
                    :top
                ],
            )
            for t, lp, d in zip(g.tokens, g.logprobs, tops, strict=True)
        ]
    )


def _piece_logprobs(part: Generation, top: int) -> dict[str, Any] | None:
    """The log-probs of a replayed chat piece."""
    logprobs = _chat_logprobs(part, top)
    return logprobs.model_dump() if logprobs else None


def _completion_logprobs(g: Generation, top: int) -> CompletionLogprobs | None:
    if g.logprobs is None:
        return None
    offsets, at = [], 0
    for t in g.tokens:
        offsets.append(at)
        at += len(t)
    tops = g.top_logprobs if top else None
    return CompletionLogprobs(
        tokens=g.tokens, token_logprobs=g.logprobs, top_logprobs=tops, text_offset=offsets
    )
