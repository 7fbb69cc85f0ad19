"""A scripted OpenAI-compatible chat model, served over real HTTP for end-to-end runner tests.

The "model" replays per-question scripts: ``scripts[key]`` is the list of raw continuations the
model would produce, in order. A request is matched to the script whose key occurs in one of its
user messages (the question text), and the continuation replayed is:

- ``index = number of assistant messages in the request`` (stateless; safe under concurrency), or
- with ``sequential=True``, one per request for that key (for conversations that shrink, e.g. a
  backtrack).

The server behaves like vLLM where the runner can tell: it cuts the continuation at the earliest
``stop`` string and drops that string (finish reason ``stop``, ``stop_reason`` = the string, unless
``report_stop_reason=False``), counts "tokens" as words, punctuation marks and whitespace runs,
honours ``max_tokens`` (finish reason ``length``), answers ``n`` identical choices, reports
``usage`` (prompt: the message tokens plus 4 per message) and, when asked, a logprob of 0.0 per
token. Every request body is kept in
``app.state.requests`` for assertions.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

TOKEN = re.compile(r"\w+|[^\w\s]|\s+")


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


class ChatRequest(BaseModel):
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    logprobs: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


def cut(text: str, stop: list[str], max_tokens: int | None) -> tuple[str, str, str | None]:
    """``(text, finish_reason, stop_reason)`` as a server with these limits returns them."""
    hits = [(text.find(s), s) for s in stop if s and text.find(s) >= 0]
    matched = min(hits)[1] if hits else None
    if matched is not None:
        text = text[: text.find(matched)]
    toks = tokens(text)
    if max_tokens is not None and len(toks) > max_tokens:
        return "".join(toks[:max_tokens]), "length", None
    return text, "stop", matched


def create_app(
    scripts: dict[str, list[str]],
    *,
    sequential: bool = False,
    report_stop_reason: bool = True,
    delay_s: float = 0.0,
) -> FastAPI:
    """The app; ``delay_s`` makes every answer that slow (for timeout tests)."""
    app = FastAPI()
    app.state.requests = []
    calls: Counter[str] = Counter()

    def continuation(messages: list[dict[str, Any]]) -> str:
        users = " ".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        key = next((k for k in scripts if k in users), None)
        if key is None:
            return "I do not know this question."
        index = calls[key] if sequential else sum(m.get("role") == "assistant" for m in messages)
        calls[key] += 1
        script = scripts[key]
        return script[index] if index < len(script) else ""

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> dict[str, Any]:
        app.state.requests.append(req.model_dump())
        await asyncio.sleep(delay_s)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        text, finish, matched = cut(continuation(req.messages), stop, req.max_tokens)
        toks = tokens(text)
        content: list[dict[str, Any]] = [
            {"token": t, "logprob": 0.0, "bytes": None, "top_logprobs": []} for t in toks
        ]
        choice = {
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "stop_reason": matched if report_stop_reason else None,
            "logprobs": {"content": content} if req.logprobs else None,
        }
        prompt_tokens = sum(len(tokens(str(m.get("content", "")))) + 4 for m in req.messages)
        return {
            "id": f"chatcmpl-{len(app.state.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{"index": i, **choice} for i in range(req.n)],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(toks) * req.n,
                "total_tokens": prompt_tokens + len(toks) * req.n,
            },
        }

    return app
