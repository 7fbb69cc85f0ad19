"""Streaming to the wire: a generation's text as server-sent events, for chat and text completions.

Both OpenAI routes stream the same way and differ only in their chunks (:class:`Chunks`: a chat
choice carries ``delta.content`` and opens with the assistant role, a text completion carries
``text``). A stream goes out in one of two ways:

- live (:class:`LiveStream`): the engine's text pieces (:mod:`hoprl.generation.streaming`) are
  collected on an asyncio queue off the event loop and sent as they arrive;
- replayed (:func:`replay`): a finished generation cut into token-sized pieces, for a request
  that asks for log-probs (known only once decoding ends).

Either way every choice ends with its ``finish_reason``, then come the ``usage`` chunk (when the
request asks for it) and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Chunks:
    """The chunks of one streamed response.

    ``head`` (id, object, created, model) goes into every chunk; ``piece(i, text)`` is choice
    ``i``'s next text, ``end(i, g)`` its finish; ``opening(i)`` (chat) opens choice ``i`` before
    any text; ``usage(gens)`` is the closing usage chunk's, when the request asked for one.
    """

    head: dict[str, Any]
    piece: Callable[[int, str], dict[str, Any]]
    end: Callable[[int, Generation], dict[str, Any]]
    opening: Callable[[int], dict[str, Any]] | None = None
    usage: Callable[[list[Generation]], dict[str, Any]] | None = None

    def event(self, choice: dict[str, Any]) -> str:
        return sse({**self.head, "choices": [choice]})

    def closing(self, gens: list[Generation]) -> Iterator[str]:
        """The usage chunk (when asked for) and ``[DONE]``."""
        if self.usage is not None:
            yield sse({**self.head, "choices": [], "usage": self.usage(gens)})
        yield sse("[DONE]")


# -- replayed ---------------------------------------------------------------------------------------


def pieces(g: Generation) -> list[tuple[str, slice]]:
    """The text as token-sized pieces for a replayed stream, each with the token indices it covers."""
    out: list[tuple[str, slice]] = []
    at = 0
    for i, t in enumerate(g.tokens):
        if at >= len(g.text) or not t or not g.text.startswith(t, at):
            break
        out.append((t, slice(i, i + 1)))
        at += len(t)
    if at < len(g.text):  # the rest (a multi-byte character split over tokens, or no token info)
        out.append((g.text[at:], slice(len(out), len(g.tokens))))
    return out


def replay(
    chunks: Chunks,
    gens: list[Generation],
    logprobs: Callable[[Generation], dict[str, Any] | None] | None = None,
) -> Iterator[str]:
    """Finished generations as a stream, choice after choice: opened, in pieces, ended.

    With ``logprobs``, each piece of a choice that has log-probs carries ``logprobs(part)``,
    ``part`` being the piece as a generation of its own tokens.
    """
    for i, g in enumerate(gens):
        if chunks.opening is not None:
            yield chunks.event(chunks.opening(i))
        for text, tokens in pieces(g):
            choice = chunks.piece(i, text)
            if logprobs is not None and g.logprobs is not None:
                part = Generation(text, g.finish_reason, None, [], g.tokens[tokens], g.logprobs[tokens])
                part.top_logprobs = g.top_logprobs[tokens] if g.top_logprobs else None
                choice["logprobs"] = logprobs(part)
            yield chunks.event(choice)
        yield chunks.event(chunks.end(i, g))
    yield from chunks.closing(gens)


# -- live -------------------------------------------------------------------------------------------

OnText = Callable[[int, str], None]


class LiveStream:
    """A generation running off the event loop whose text pieces arrive on a queue as decoded.

    live = await LiveStream.start(lambda on_text: generate(replace(params, on_text=on_text)))
    return StreamingResponse(live.events(chunks, n), media_type="text/event-stream")
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

    async def events(self, chunks: Chunks, choices: int) -> AsyncIterator[str]:
        """The SSE lines: every choice's opening (chat), each piece as it comes, then each choice's
        rest and end, and the closing. A failure after the first piece is an ``{"error": ...}``
        event, which the openai client raises as an ``APIError``."""
        if chunks.opening is not None:
            for i in range(choices):
                yield chunks.event(chunks.opening(i))
        sent: dict[int, str] = {}
        item = self.first
        while item is not None:
            sent[item[0]] = sent.get(item[0], "") + item[1]
            yield chunks.event(chunks.piece(*item))
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
                yield chunks.event(chunks.piece(i, rest))
            yield chunks.event(chunks.end(i, g))
        for line in chunks.closing(gens):
            yield line
