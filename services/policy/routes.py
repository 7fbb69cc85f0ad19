"""HTTP routes of the policy: the OpenAI-compatible subset, ``/v1/answer``, rollouts and admin.

Streaming (``stream: true``) answers server-sent events: ``data: {chunk}`` lines and a final
``data: [DONE]``. The transformers engine decodes a request as a whole (its batch may hold other
clients' requests), so the chunks, one per generated token, are sent once decoding has finished.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from services.errors import ERROR_RESPONSES, ApiError, error_response
from services.policy.agent import Policy
from services.policy.engines import Generation, Prompt, SamplingParams
from services.policy.model import is_checkpoint
from services.policy.protocol import (
    AnswerRequest,
    AnswerResponse,
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CheckpointRequest,
    CheckpointResponse,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    RolloutRequest,
    RolloutResponse,
    TokenLogprob,
    TopLogprob,
    Usage,
    _OpenAIRequest,
    sse,
)
from services.policy.settings import PolicySettings

POLICY_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    **{
        code: {**ERROR_RESPONSES[422], "description": text}
        for code, text in {
            429: "too many generation requests in flight",
            502: "the retriever answered with an error",
            504: "the request ran past POLICY_REQUEST_TIMEOUT_S",
        }.items()
    },
}
router = APIRouter(responses=POLICY_ERRORS)
SSE_RESPONSE: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {}}}}


def _policy(request: Request) -> Policy:
    policy: Policy = request.app.state.policy
    return policy


def _sampling(
    s: PolicySettings, body: _OpenAIRequest, max_tokens: int | None, default: int
) -> SamplingParams:
    """Validate the common OpenAI parameters against the service limits."""
    tokens = max_tokens or min(default, s.max_tokens)
    if tokens > s.max_tokens:
        raise ApiError(
            422, "max_tokens_too_large", f"max_tokens={tokens} exceeds {s.max_tokens} (POLICY_MAX_TOKENS)"
        )
    if body.n > s.max_n:
        raise ApiError(422, "n_too_large", f"n={body.n} exceeds {s.max_n} (POLICY_MAX_N)")
    stop = body.stops()
    if len(stop) > 8 or any(not x for x in stop):
        raise ApiError(422, "invalid_stop", "stop takes at most 8 non-empty strings")
    return SamplingParams(
        max_tokens=tokens, temperature=body.temperature, top_p=body.top_p, n=body.n, stop=stop, seed=body.seed
    )


async def _generate(
    policy: Policy, prompts: Sequence[Prompt], params: SamplingParams
) -> list[list[Generation]]:
    """Run the engine off the event loop; a prompt it cannot take is a 422 naming why."""
    chars = sum(len(p) if isinstance(p, str) else sum(len(m["content"]) for m in p) for p in prompts)
    if chars > policy.settings.max_prompt_chars:
        limit = policy.settings.max_prompt_chars
        raise ApiError(
            422, "prompt_too_long",
            f"the prompt has {chars} characters; the limit is {limit} (POLICY_MAX_PROMPT_CHARS)",
        )  # fmt: skip
    deadline = time.monotonic() + policy.settings.request_timeout_s
    params = SamplingParams(**{**params.__dict__, "deadline": deadline})
    with policy.admitted():
        try:
            return await run_in_threadpool(policy.engine.generate, prompts, params)
        except ValueError as exc:
            raise ApiError(422, "invalid_prompt", str(exc)) from None


def _usage(gens: list[Generation], prompts: int) -> Usage:
    prompt = sum(g.prompt_tokens for g in gens[:: max(1, len(gens) // prompts)])
    completion = sum(len(g.token_ids) for g in gens)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


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


def _pieces(g: Generation) -> list[tuple[str, slice]]:
    """The text as token-sized pieces for streaming, each with the token indices it covers."""
    pieces: list[tuple[str, slice]] = []
    at = 0
    for i, t in enumerate(g.tokens):
        if at >= len(g.text) or not t or not g.text.startswith(t, at):
            break
        pieces.append((t, slice(i, i + 1)))
        at += len(t)
    if at < len(g.text):  # the rest (a multi-byte character split over tokens, or no token info)
        pieces.append((g.text[at:], slice(len(pieces), len(g.tokens))))
    return pieces


@router.get("/v1/models", operation_id="list_models")
def list_models(request: Request) -> ModelList:
    policy = _policy(request)
    card = ModelCard(id=policy.model_id, created=int(time.time()), root=policy.engine.model_path)
    return ModelList(data=[card])


def _check_model(policy: Policy, model: str | None) -> str:
    if model not in (None, policy.model_id, policy.engine.model_path):
        raise ApiError(
            404,
            "model_not_found",
            f"model {model!r} is not served here; this service serves {policy.model_id!r}",
        )
    return policy.model_id


@router.post(
    "/v1/chat/completions",
    operation_id="chat_completions",
    response_model=ChatCompletionResponse,
    responses=SSE_RESPONSE,
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """OpenAI chat completions: the model's chat template, then sampling (``stream`` for SSE)."""
    policy = _policy(request)
    model = _check_model(policy, body.model)
    params = _sampling(policy.settings, body, body.max_completion_tokens or body.max_tokens, 256)
    top = body.top_logprobs or 0
    params = SamplingParams(**{**params.__dict__, "logprobs": body.logprobs, "top_logprobs": top})
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages
    ]
    (gens,) = await _generate(policy, [messages], params)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    usage = _usage(gens, 1)
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _chat_chunks(rid, created, model, gens, top, usage if include else None)
        return StreamingResponse(chunks, media_type="text/event-stream")
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
    return ChatCompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)


def _chat_chunks(
    rid: str, created: int, model: str, gens: list[Generation], top: int, usage: Usage | None
) -> Iterator[str]:
    head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    for i, g in enumerate(gens):
        yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}}]})
        for text, tokens in _pieces(g):
            choice: dict[str, Any] = {"index": i, "delta": {"content": text}}
            if g.logprobs is not None:
                part = Generation(text, g.finish_reason, None, [], g.tokens[tokens], g.logprobs[tokens])
                part.top_logprobs = g.top_logprobs[tokens] if g.top_logprobs else None
                logprobs = _chat_logprobs(part, top)
                choice["logprobs"] = logprobs.model_dump() if logprobs else None
            yield sse({**head, "choices": [choice]})
        end = {"index": i, "delta": {}, "finish_reason": g.finish_reason, "stop_reason": g.stop_reason}
        yield sse({**head, "choices": [end]})
    if usage is not None:
        yield sse({**head, "choices": [], "usage": usage.model_dump()})
    yield sse("[DONE]")


@router.post(
    "/v1/completions", operation_id="completions", response_model=CompletionResponse, responses=SSE_RESPONSE
)
async def completions(body: CompletionRequest, request: Request) -> Any:
    """OpenAI (legacy) text completions: the prompt as raw text, no chat template."""
    policy = _policy(request)
    model = _check_model(policy, body.model)
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts or not all(p.strip() for p in prompts):
        raise ApiError(422, "empty_prompt", "every prompt needs at least one non-blank character")
    params = _sampling(policy.settings, body, body.max_tokens, 16)
    if len(prompts) * body.n > policy.settings.max_n:
        raise ApiError(422, "n_too_large", f"prompts x n exceeds {policy.settings.max_n} (POLICY_MAX_N)")
    top = body.logprobs or 0
    params = SamplingParams(**{**params.__dict__, "logprobs": body.logprobs is not None, "top_logprobs": top})
    gens = [g for group in await _generate(policy, prompts, params) for g in group]
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    usage = _usage(gens, len(prompts))
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _completion_chunks(rid, created, model, gens, top, usage if include else None),
            media_type="text/event-stream",
        )
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
    return CompletionResponse(id=rid, created=created, model=model, choices=choices, usage=usage)


def _completion_chunks(
    rid: str, created: int, model: str, gens: list[Generation], top: int, usage: Usage | None
) -> Iterator[str]:
    head = {"id": rid, "object": "text_completion", "created": created, "model": model}
    for i, g in enumerate(gens):
        for text, _ in _pieces(g):
            yield sse(
                {**head, "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": None}]}
            )
        end = {
            "index": i,
            "text": "",
            "logprobs": None,
            "finish_reason": g.finish_reason,
            "stop_reason": g.stop_reason,
        }
        yield sse({**head, "choices": [end]})
    if usage is not None:
        yield sse({**head, "choices": [], "usage": usage.model_dump()})
    yield sse("[DONE]")


@router.post("/v1/answer", operation_id="answer")
async def answer(body: AnswerRequest, request: Request) -> AnswerResponse:
    """Answer a question with a recipe's agent loop against the retriever: answer, citations, trace."""
    return await _policy(request).answer(body)


@router.post("/v1/rollouts", operation_id="rollouts")
async def rollouts(body: RolloutRequest, request: Request) -> RolloutResponse:
    """Questions x n_samples episodes as token-level trajectories (masks, log-probs) for training."""
    policy = _policy(request)
    start = time.perf_counter()
    out = await policy.rollouts(body)
    return RolloutResponse(
        recipe=body.recipe, model=policy.model_id, rollouts=out, took_s=time.perf_counter() - start
    )


def _unauthorized(message: str) -> JSONResponse:
    response = error_response(401, "unauthorized", message)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


@router.post(
    "/v1/admin/checkpoint",
    operation_id="switch_checkpoint",
    response_model=CheckpointResponse,
    responses={
        401: ERROR_RESPONSES[422] | {"description": "no bearer token"},
        403: ERROR_RESPONSES[422] | {"description": "wrong token or admin disabled"},
    },
)
async def switch_checkpoint(
    body: CheckpointRequest, request: Request, authorization: str | None = Header(None)
) -> Any:
    """Load another checkpoint and serve it without a restart (``Authorization: Bearer <token>``)."""
    policy = _policy(request)
    token = policy.settings.admin_token
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return _unauthorized("send 'Authorization: Bearer <POLICY_ADMIN_TOKEN>'")
    if token is None:
        raise ApiError(
            403, "admin_disabled", "admin routes are disabled: set POLICY_ADMIN_TOKEN to enable them"
        )
    if not secrets.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        raise ApiError(403, "forbidden", "the admin token is wrong")
    path = body.path
    if policy.settings.engine != "openai":
        folder = Path(path).expanduser()
        if not folder.exists():
            raise ApiError(
                404, "checkpoint_not_found", f"no such checkpoint folder on the policy's machine: {path!r}"
            )
        if not folder.is_dir() or not is_checkpoint(folder):
            raise ApiError(
                422, "not_a_checkpoint", f"{path!r} holds no config.json and weights (save_pretrained output)"
            )
        path = str(folder.resolve())
    start = time.perf_counter()
    try:
        await run_in_threadpool(policy.engine.load, path)
    except Exception as exc:  # a broken checkpoint is the caller's problem; the old weights stay
        raise ApiError(422, "checkpoint_load_failed", f"could not load {path!r}: {exc}") from None
    return CheckpointResponse(
        model=policy.model_id, root=policy.engine.model_path, took_s=time.perf_counter() - start
    )
