"""Judge fixtures: live judge services over real HTTP, a scripted LLM endpoint, the real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from services.judge.app import create_app
from services.judge.settings import JudgeSettings
from services.local import LocalServer

REDIS_URL = "redis://127.0.0.1:6379/0"
LLM_MODEL = "scripted-judge"


class ScriptedLLM:
    """An OpenAI-compatible endpoint (``/v1/models``, ``/v1/chat/completions``) with canned replies.

    A chat request gets ``replies[key]`` for the first ``key`` found in its user message, else
    ``default``. The first ``fail_first`` requests answer HTTP ``fail_status`` instead, and every
    answer waits ``delay_s`` first (for timeout tests). Request bodies are kept in ``requests``.
    """

    def __init__(
        self,
        replies: dict[str, str] | None = None,
        default: str = "NO",
        fail_first: int = 0,
        fail_status: int = 500,
        delay_s: float = 0.0,
    ) -> None:
        self.replies, self.default = replies or {}, default
        self.fail_first, self.fail_status, self.delay_s = fail_first, fail_status, delay_s
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/chat/completions", response_model=None)(self.chat)

    async def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": LLM_MODEL, "object": "model", "created": 0, "owned_by": "t"}],
        }

    async def chat(self, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        self.requests.append(body)
        await asyncio.sleep(self.delay_s)
        if len(self.requests) <= self.fail_first:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=self.fail_status)
        prompt = " ".join(m["content"] for m in body["messages"] if m["role"] == "user")
        reply = next((r for key, r in self.replies.items() if key in prompt), self.default)
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }


@contextmanager
def judge_service(**settings: Any) -> Iterator[str]:
    """Base URL of a live judge with these settings (fast retries unless given)."""
    settings = {"backoff_s": 0.01, "timeout_s": 5.0} | settings
    with LocalServer(create_app(JudgeSettings(**settings))) as server:
        yield server.url


@contextmanager
def llm_judge(llm: ScriptedLLM, **settings: Any) -> Iterator[str]:
    """A judge with the openai backend in front of ``llm``, both served over HTTP."""
    with LocalServer(llm.app) as endpoint:
        base = {"backend": "openai", "openai_base_url": f"{endpoint.url}/v1", "model": LLM_MODEL}
        with judge_service(**(base | settings)) as url:
            yield url


@pytest.fixture(scope="module")
def rules_url() -> Iterator[str]:
    """The default judge: rules backend, in-process cache."""
    with judge_service() as url:
        yield url


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to this test on the real Redis at 127.0.0.1:6379; its keys are deleted after."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}); start one to test the Redis cache")
    prefix = f"hoprl-test:judge:{uuid.uuid4().hex}:"
    yield prefix
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()
