"""Streaming inside the engine: a row's tokens become text pieces no later token can change.

Each row of the transformers engine's batch has its own :class:`TextStream`
(:mod:`hoprl.generation.decoding` pushes the row's every new token into it), which hands the pieces
to the request's ``SamplingParams.on_text``. The policy service turns them into server-sent events
(:mod:`services.policy.streaming`).

    stream = TextStream(tokenizer, {eos}, ("</search>",), send)
    for token in row_tokens:
        stream.push(token)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hoprl.generation.engines import find_stop

log = logging.getLogger("hoprl.generation")


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
