"""The policy service: ``uvicorn services.policy.app:app`` or ``hoprl serve policy``.

The model loads at startup (the first start converts the bundled GGUF model once, ~20 s; later
starts load the cached dense copy in under a second).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from hoprl.clients.http import ServiceError
from hoprl.clients.retriever import RetrieverClient
from hoprl.generation.engines import Engine
from hoprl.generation.model import resolve_model
from hoprl.generation.openai_engine import OpenAIEngine
from hoprl.generation.transformers_engine import TransformersEngine
from hoprl.generation.vllm_engine import VllmEngine
from services.app import Limits, create_service_app, publish_limits
from services.errors import ApiError
from services.policy.agent import Policy
from services.policy.batch_routes import batch_router
from services.policy.openai_routes import PolicyDep, check_tools_render
from services.policy.routes import router
from services.policy.settings import PolicySettings


def create_engine(settings: PolicySettings) -> Engine:
    """The engine ``settings.engine`` names, loaded with ``settings.model`` (or the default model)."""
    if settings.engine == "openai":
        if not settings.openai_base_url:
            raise ValueError("POLICY_ENGINE=openai needs POLICY_OPENAI_BASE_URL (the remote's /v1 root)")
        key = settings.openai_api_key.get_secret_value()
        return OpenAIEngine(settings.openai_base_url, key, settings.model, settings.tokenizer)
    path = resolve_model(settings.model, settings.model_cache)
    if settings.engine == "vllm":
        return VllmEngine(
            path, settings.dtype, settings.gpu_memory_utilization, settings.kv_cache_gib, settings.eager,
            settings.max_batch, max_num_batched_tokens=settings.max_num_batched_tokens,
            cpu_reserved_cores=settings.cpu_reserved_cores,
        )  # fmt: skip
    return TransformersEngine(
        path, settings.dtype, settings.torch_threads, settings.max_batch, settings.autocast,
        settings.prefill_threads, settings.prefix_cache_tokens,
    )  # fmt: skip


async def ready(policy: PolicyDep) -> dict[str, Any]:
    """The model is loaded and the retriever answers its /readyz."""
    try:
        response = await policy.retriever.http.get("/readyz", timeout=5.0)
        retriever = "ready" if response.status_code == 200 else f"HTTP {response.status_code}"
    except httpx.TransportError as exc:
        retriever = f"unreachable ({type(exc).__name__})"
    if retriever != "ready":
        raise ApiError(
            503, "retriever_unavailable",
            f"the retriever at {policy.settings.retriever_url} is not ready: {retriever}",
            {"model": True, "retriever": retriever},
        )  # fmt: skip
    return {"model": policy.model_id, "engine": policy.settings.engine}


def create_app(settings: PolicySettings | None = None) -> FastAPI:
    settings = settings or PolicySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await run_in_threadpool(create_engine, settings)
        app.state.policy = Policy(settings, engine)
        try:
            yield
        finally:
            await app.state.policy.aclose()
            engine.close()

    description = (
        "The policy model served: OpenAI-compatible completions, /v1/answer for apps "
        "(a recipe's agent loop against the retriever), token-level rollouts, checkpoint switching."
    )
    token = settings.admin_token.get_secret_value() if settings.admin_token else None
    app = create_service_app("policy", description, lifespan, router, ready, token, "POLICY_ADMIN_TOKEN")
    app.include_router(batch_router)
    publish_limits(app, live_limits(settings))
    publish_chat_turns(app)
    publish_collections(app, settings)
    return app


COLLECTION_FIELDS = ("AnswerRequest", "AnswerBatchRequest", "RolloutRequest")


def publish_collections(app: FastAPI, settings: PolicySettings) -> None:
    """Each ``/openapi.json`` lists the collections the retriever holds as the ``collection`` field's
    values: a request naming another is a 404, so a client or fuzzer reading the document learns
    which names serve. Built per request (collections come and go); without an answer from the
    retriever the field keeps its bare name pattern."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        schema = build()
        try:
            with RetrieverClient(settings.retriever_url, timeout=2.0) as client:
                names = sorted(info.name for info in client.collections())
        except (httpx.HTTPError, ServiceError):
            return schema
        if not names:
            return schema
        schema = copy.deepcopy(schema)
        models = schema["components"]["schemas"]
        for model in COLLECTION_FIELDS:
            field = models[model]["properties"]["collection"]
            for branch in field.get("anyOf", [field]):
                if branch.get("type") == "string":
                    branch["enum"] = names
            field["description"] = f"{field.get('description', '')}; one of the retriever's collections"
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def publish_chat_turns(app: FastAPI) -> None:
    """Once the model is loaded, a chat template that cannot render tool turns (the default model's)
    leaves them out of the published ChatMessage schema: such a turn is a 400 here, so a client or
    fuzzer reading the document must not take it for a valid request."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        policy = getattr(app.state, "policy", None)
        if policy is not None and not renders_tool_turns(policy):
            turns = schema["components"]["schemas"]["ChatMessage"]["oneOf"]
            no_calls = turns[0]["properties"]["tool_calls"]
            turns[:] = [
                t
                for t in turns
                if t["properties"]["role"].get("const") != "tool"
                and "tool_calls" not in t.get("required", [])
            ]
            for turn in turns:
                turn["properties"]["tool_calls"] = no_calls
            schema["components"]["schemas"]["ChatMessage"]["description"] += (
                " The served model's chat template cannot render tool turns: no tool_calls, no tool role."
            )
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def renders_tool_turns(policy: Policy) -> bool:
    """Whether the served chat template renders an assistant tool call and a tool result."""
    call = {"id": "call-0", "type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-0", "content": "result-0"},
    ]  # fmt: skip
    try:
        check_tools_render(policy, messages)
    except ApiError:
        return False
    return True


def live_limits(s: PolicySettings) -> Limits:
    """The POLICY_* limits as the OpenAPI document publishes them (services.app.publish_limits), so
    a schema-valid request is one this service takes."""
    steps, chars = {"maximum": s.max_steps}, {"maxLength": s.max_question_chars}
    tokens, n = {"maximum": s.max_tokens}, {"maximum": s.max_n}
    return {
        "AnswerRequest.question": chars, "AnswerRequest.max_steps": steps,
        "AnswerBatchRequest.questions": {"maxItems": s.max_rollouts}, "AnswerBatchRequest.questions[]": chars,
        "AnswerBatchRequest.max_steps": steps,
        "RolloutRequest.questions": {"maxItems": s.max_rollouts},
        "RolloutRequest.n_samples": {"maximum": s.max_rollouts},
        "RolloutShape.max_steps": steps, "RolloutShape.token_budget": {"maximum": s.token_budget},
        "RolloutShape.max_new_tokens_per_step": {"maximum": s.max_new_tokens_per_step},
        "ChatCompletionRequest.max_tokens": tokens, "ChatCompletionRequest.max_completion_tokens": tokens,
        "ChatCompletionRequest.n": n, "CompletionRequest.max_tokens": tokens, "CompletionRequest.n": n,
        "CompletionRequest.prompt": {"maxItems": s.max_n},
    }  # fmt: skip


app = create_app()
