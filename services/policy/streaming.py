"""Streaming to the wire: the engine's text pieces (:mod:`hoprl.generation.streaming`) as server-sent events.

:class:`LiveStream` runs a generation off the event loop, collects those pieces
on an asyncio queue and turns them into server-sent events as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from hoprl.generation.engines import Generation
from services.policy.openai_errors import error_event

log = logging.getLogger("hoprl.policy")


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    """One server-sent event line: ``data: {...}`` (or ``data: [DONE]``)."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n"
    body = (
        payload.model_dump_json()
        if isinstance(payload, BaseModel)
        else json.dumps(payload, separators=(",", ":"))
    )
    return f"data: {body}\n\n"


# -- to the wire -----------------------------------------------------------------------------------

OnText = Callable[[int, str], None]


class LiveStream:
    """A generation running off the event loop whose text pieces arrive on a queue as decoded.

    live = await LiveStream.start(lambda on_text: generate(replace(params, on_text=on_text)))
    return StreamingResponse(live.events(head, [], piece, end), media_type="text/event-stream")
    """

    queue: asyncio.Queue[tuple[int, str] | None]
    task: asyncio.Future[list[list[Generation]]]
    first: tuple[int, str] | None

    @classmethod
    async def start(cls, generate: Callable[[OnText], Awaitable[list[list[Generation]]]]) -> LiveStream:
        """Start ``generate(on_text)`` and wait for its first piece: an error before it (a 429, a
        prompt too long) is raised here, so it is still an HTTP error, not a broken stream."""
        live, loop = cls(), asyncio.get_running_loop()
        live.queue = asyncio.Queue()

        def on_text(choice: int, text: str) -> None:  # called on the decoding thread
            loop.call_soon_threadsafe(live.queue.put_nowait, (choice, text))

        def finished(task: asyncio.Future[Any]) -> None:  # runs after every piece the thread queued
            if not task.cancelled():
                task.exception()  # read here: a client that left must not leave an unread error behind
            live.queue.put_nowait(None)

        live.task = asyncio.ensure_future(generate(on_text))
        live.task.add_done_callback(finished)
        live.first = await live.queue.get()
        if live.first is None:
            live.task.result()
        return live

    async def events(
        self,
        head: dict[str, Any],
        opening: list[dict[str, Any]],
        piece: Callable[[int, str], dict[str, Any]],
        end: Callable[[int, Generation], dict[str, Any]],
        usage: Callable[[list[Generation]], dict[str, Any]] | None = None,
    ) -> AsyncIterator[str]:
        """The SSE lines: the ``opening`` choices, each piece as it comes, then each choice's rest
        and end, the ``usage`` chunk and ``[DONE]``. A failure after the first piece is an
        ``{"error": ...}`` event, which the openai client raises as an ``APIError``."""
        for choice in opening:
            yield sse({**head, "choices": [choice]})
        sent: dict[int, str] = {}
        item = self.first
        while item is not None:
            sent[item[0]] = sent.get(item[0], "") + item[1]
            yield sse({**head, "choices": [piece(*item)]})
            item = await self.queue.get()
        try:
            gens = [g for group in await self.task for g in group]
        except Exception as exc:
            yield sse(error_event(exc))
            return
        for i, g in enumerate(gens):
            streamed = sent.get(i, "")
            if not g.text.startswith(streamed):  # TextStream's invariant; a tokenizer could break it
                log.warning("choice %d streamed %r, which does not begin its text %r", i, streamed, g.text)
            if rest := g.text[len(streamed) :]:
                yield sse({**head, "choices": [piece(i, rest)]})
            yield sse({**head, "choices": [end(i, g)]})
        if usage is not None:
            yield sse({**head, "choices": [], "usage": usage(gens)})
        yield sse("[DONE]")
