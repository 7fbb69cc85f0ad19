"""EVO-RAG's protocol: the prompt, the action parser, the ``<information>`` block, the expert."""

from __future__ import annotations

import random

from hoprl.data.synthetic import hops_for
from hoprl.domain import Action, Question, RetrievedDoc
from hoprl.recipes.parsing import parse_tags

SYSTEM_PROMPT = """You answer multi-hop questions by searching a document collection step by step.
Each turn, reason briefly inside <think>...</think>, then take exactly one action:
- <search>query</search> to retrieve documents; results come back inside <information>.
- <backtrack/> to discard your last search and its results when they led nowhere.
- <answer>short answer</answer> when the evidence answers the question.
- <refuse/> when the evidence shows the question cannot be answered.
Search for one fact per step, avoid repeating earlier queries, and finish within {t_max} steps."""

_ACTION_TAGS = ("search", "answer")
_MARKERS = {"<backtrack/>": "backtrack", "<refuse/>": "refuse"}


def parse_action(segment: str) -> Action:
    """Parse one EVO-RAG segment; anything unreadable is ``Action('format_error')``, never raised.

    The action is the first ``<search>``/``<answer>`` block or marker outside ``<think>``; more
    than one action, an unclosed or empty action block, or tags inside it are format errors.
    """
    parsed = parse_tags(segment, ["think", *_ACTION_TAGS])
    fatal = [e for e in parsed.errors if e.startswith(("too_long", "nested"))]
    if fatal:
        return Action("format_error", error=fatal[0])
    spans = [(b.start, b.end) for b in parsed.blocks]
    found: list[tuple[int, str, str | None, bool]] = [
        (b.start, b.tag, b.content, b.closed) for b in parsed.blocks if b.tag in _ACTION_TAGS
    ]
    for marker, kind in _MARKERS.items():
        at = segment.find(marker)
        while at != -1:
            if not any(s <= at < e for s, e in spans):
                found.append((at, kind, None, True))
            at = segment.find(marker, at + 1)
    if not found:
        return Action("format_error", error="no action: use <search>, <backtrack/>, <answer> or <refuse/>")
    if len(found) > 1:
        return Action("format_error", error=f"{len(found)} actions in one segment; take one per turn")
    _, kind, content, closed = found[0]
    if kind in _MARKERS.values():
        return Action(kind)  # type: ignore[arg-type]
    if not closed:
        return Action("format_error", error=f"unclosed <{kind}>")
    if not content or "<" in content:
        return Action("format_error", error=f"<{kind}> is empty or contains a tag")
    if kind == "search":
        return Action("search", queries=[content], query_kinds=["search"])
    return Action("answer", answer=content)


def render_information(docs: list[list[RetrievedDoc]]) -> str:
    """Retrieved documents as the ``<information>`` block the policy reads (mask 0)."""
    lines = [f"Doc {i} (Title: {d.title}) {d.text}" for i, d in enumerate((d for r in docs for d in r), 1)]
    return "\n<information>\n" + "\n".join(lines) + "\n</information>\n"


def _hop_thought(title: str, relation: str) -> str:
    need = f"the {relation.replace('_', ' ')} of {title}" if relation else f"what {title} says"
    return f"<think>Next I need {need}.</think>"


def expert_segments(question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
    """One SEARCH per gold hop, then ANSWER (or REFUSE when ``answers == []``).

    With probability ``noise`` per hop, a search for a distractor paragraph's title and a
    BACKTRACK come first, so warm-start data shows recovery. Each segment ends with a stop
    sequence, as the runner would cut it.
    """
    rng = random.Random(f"{seed}:{question.id}")
    distractors = [p.title for p in question.paragraphs if not p.is_gold]
    segments = []
    for hop in hops_for(question):
        thought = _hop_thought(hop.title, hop.relation)
        if distractors and rng.random() < noise:
            segments.append(f"{thought}\n<search>{rng.choice(distractors)}</search>")
            segments.append("<think>That result is off the path; drop it.</think>\n<backtrack/>")
        segments.append(f"{thought}\n<search>{hop.query}</search>")
    if question.answers:
        final = f"<think>The evidence answers it.</think>\n<answer>{question.answers[0]}</answer>"
    else:
        final = "<think>No document states the last fact; it cannot be answered.</think>\n<refuse/>"
    return [*segments, final]
