"""Tag parsing shared by the tag-based protocols (``<think>``, ``<search>``, ``<answer>``, ...).

Policies under RL emit anything, so the parser never raises on model output: it returns the blocks
it could read plus a list of errors, and each recipe decides what an error means (a format error
action, a format reward of 0 or -1).

Rules, in the order they apply:

- Input longer than ``max_chars`` is rejected whole (error ``too_long``) before any scanning, so a
  run-away generation costs nothing to parse.
- Only the tags the caller names are structure; any other ``<x>`` is plain content.
- A block's content is opaque: a known tag *inside* a closed block is content, not a block.
- A block with no closing tag ends at the next opening of a known tag, or at the end of the text
  (the usual case: a segment cut at a stop sequence). It is kept with ``closed=False`` and an
  ``unclosed`` error, so lenient callers (action parsing) can use it and strict ones (format
  rewards) reject it. Running to the end of the text, it loses a cut-off start of its closing tag
  (``<answer>Paris</ans``: a segment that hit the token limit inside the tag reads ``Paris``).
- The same tag opened again before its close (``<answer>a <answer>b</answer>``) is rejected:
  an error ``nested`` and scanning stops there.
- A closing tag with no opening is an error ``stray``.
- Contents are stripped of surrounding whitespace.

Example::

    parsed = parse_tags("<think>hop 1</think><search>Acme founder", ["think", "search", "answer"])
    parsed.first("search").content  # 'Acme founder' (closed=False, end of text taken as close)
    parsed.ok                       # False: the search block was never closed
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

#: Longest text the parser scans; a generated segment of a few hundred tokens is ~2 KB.
MAX_CHARS = 8_192


@dataclass(frozen=True)
class Block:
    """One ``<tag>content</tag>`` block; ``start``/``end`` are character offsets of the whole block."""

    tag: str
    content: str
    start: int
    end: int
    closed: bool = True


@dataclass
class Parsed:
    """Blocks in text order plus every problem found (empty ``errors`` means well-formed)."""

    blocks: list[Block] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def tags(self) -> list[str]:
        """The tag sequence, e.g. ``['think', 'search']``."""
        return [b.tag for b in self.blocks]

    def all(self, tag: str) -> list[Block]:
        return [b for b in self.blocks if b.tag == tag]

    def first(self, tag: str) -> Block | None:
        return next((b for b in self.blocks if b.tag == tag), None)

    def last(self, tag: str) -> Block | None:
        return next((b for b in reversed(self.blocks) if b.tag == tag), None)

    def contents(self, tag: str) -> list[str]:
        return [b.content for b in self.blocks if b.tag == tag]


@lru_cache(maxsize=64)
def _patterns(tags: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(f"<({names})>"), re.compile(f"</({names})>")


def _stray(close_re: re.Pattern[str], text: str, start: int, end: int, errors: list[str]) -> None:
    for m in close_re.finditer(text, start, end):
        errors.append(f"stray: </{m.group(1)}> at {m.start()} has no opening tag")


def parse_tags(text: str, tags: Iterable[str], *, max_chars: int = MAX_CHARS) -> Parsed:
    """Read the ``tags`` blocks of ``text``; never raises on any string.

    Args:
        text: model output (one segment, or a whole completion).
        tags: the tag names that are structure for this protocol, e.g. ``["think", "answer"]``.
        max_chars: longer input is rejected with a ``too_long`` error without scanning.
    """
    out = Parsed()
    if len(text) > max_chars:
        out.errors.append(f"too_long: {len(text)} characters > {max_chars}")
        return out
    open_re, close_re = _patterns(tuple(sorted(set(tags))))
    pos = 0
    while (m := open_re.search(text, pos)) is not None:
        _stray(close_re, text, pos, m.start(), out.errors)
        tag, body = m.group(1), m.end()
        close = text.find(f"</{tag}>", body)
        reopen = text.find(f"<{tag}>", body)
        if close == -1:
            nxt = open_re.search(text, body)
            end = nxt.start() if nxt else len(text)
            content = text[body:end] if nxt else _cut_close(text[body:end], tag)
            out.blocks.append(Block(tag, content.strip(), m.start(), end, closed=False))
            out.errors.append(f"unclosed: <{tag}> at {m.start()} has no </{tag}>")
            pos = end
            continue
        if reopen != -1 and reopen < close:
            out.errors.append(f"nested: <{tag}> at {reopen} opens inside <{tag}> at {m.start()}")
            return out
        end = close + len(tag) + 3
        out.blocks.append(Block(tag, text[body:close].strip(), m.start(), end))
        pos = end
    _stray(close_re, text, pos, len(text), out.errors)
    return out


def _cut_close(content: str, tag: str) -> str:
    """``content`` without a trailing ``</``, ``</t``, ... ``</tag`` (a closing tag cut short)."""
    close = f"</{tag}"
    for k in range(len(close), 1, -1):
        if content.endswith(close[:k]):
            return content[:-k]
    return content


def outside_text(text: str, blocks: list[Block]) -> str:
    """The text not covered by ``blocks`` (stripped), e.g. to require nothing outside the tags."""
    parts, pos = [], 0
    for b in blocks:
        parts.append(text[pos : b.start])
        pos = b.end
    parts.append(text[pos:])
    return "".join(parts).strip()
