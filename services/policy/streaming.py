"""Streaming, from the decoding loop to the wire.

**In the engine**, each row of the transformers engine's batch has its own :class:`TextStream`
(:mod:`services.policy.decoding` pushes the row's every new token into it), which turns tokens into
text pieces no later token can change and hands them to the request's ``SamplingParams.on_text``.

    stream = TextStream(tokenizer, {eos}, ("</search>",), send)
    for token in row_tokens:
        stream.push(token)

**In the routes**, :class:`LiveStream` runs a generation off the event loop, collects those pieces
on an asyncio queue and turns them into server-sent events as they arrive.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel

from services.policy.engines import Generation, find_stop
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


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still be the start of a stop string.

    The longest tail that is a proper prefix of some stop string: holding it back covers the
    earliest place a stop string may still begin (``"xaa"`` holds ``"aa"`` for the stop ``"aab"``).
    """
    return max(
        (n for s in stop for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])),
        default=0,
    )


class TextStream:
    """One row's decoded text, sent to ``sink`` in pieces no later token can change.

    - a trailing U+FFFD (a character whose UTF-8 bytes span two tokens) waits for the next token;
    - a tail that could begin a stop string waits until it cannot (:func:`held_back`);
    - nothing from the first stop string or the first end token (``end_ids``) on is sent.

    The pieces, concatenated, are therefore a prefix of the engine's final ``Generation.text``
    (same tokens, same decoding, same stop cut); whoever consumes them sends the rest
    (``final.text[len(sent):]``) once decoding ends.
    """

    def __init__(
        self, tokenizer: Any, end_ids: set[int], stop: Sequence[str], sink: Callable[[str], None]
    ) -> None:
        self.tokenizer, self.end_ids, self.stop, self.sink = tokenizer, end_ids, stop, sink
        self.ids: list[int] = []
        self.sent = 0
        self.done = False

    def push(self, token: int) -> None:
        if self.done:
            return
        if token in self.end_ids:
            self.done = True
            return
        self.ids.append(token)
        # The whole row is decoded each step, not the new token alone: that keeps characters split
        # over tokens and the tokenizer's own merging right; a row is a few hundred tokens at most.
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        hit = find_stop(text, self.stop)
        if hit is not None:
            end, self.done = hit[0], True
        else:
            end = len(text) - held_back(text, self.stop)
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        if end > self.sent:
            try:
                self.sink(text[self.sent : end])
            except Exception:  # a gone client must not break the batch the other rows share
                log.warning("a streaming consumer failed; its row keeps decoding unstreamed", exc_info=True)
                self.done = True
            self.sent = end


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
