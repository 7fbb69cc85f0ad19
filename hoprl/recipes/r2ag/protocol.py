"""R2AG's protocol: the prompt, the expansion parser, the injected evidence and the scripted expert.

One expansion (one policy turn) reasons, then proposes sub-queries or stops, as the paper's
prompt asks::

    <think>...</think>
    <base-Q>a query decomposed from the question</base-Q>
    <predicted-Q>a guess at the next hop's query</predicted-Q>
    <end/>

    <think>...</think>
    <base-Q>stop retrieval</base-Q>
    <predicted-Q>none</predicted-Q>
    <end/>

``<base-Q>stop retrieval</base-Q>`` is the stop signal and ``<predicted-Q>none</predicted-Q>``
means "no prediction": neither is a query, and neither ever reaches the retriever. ``<end/>``
is the turn's stop sequence (the project's; the runner keeps it in the text).
"""

from __future__ import annotations

import re

from hoprl.data.synthetic import hops_for
from hoprl.domain import Action, Question, RetrievedDoc
from hoprl.recipes.parsing import outside_text, parse_tags
from hoprl.recipes.r2ag.config import KIND_OF_TAG, TAGS

END = "<end/>"
STOP_QUERY = "stop retrieval"
NO_PREDICTION = "none"
_STOP_RE = re.compile(r"stop retrieval\W*", re.IGNORECASE)
_NONE_RE = re.compile(r"none\W*", re.IGNORECASE)

SYSTEM_PROMPT = f"""You find the documents that answer a multi-hop question by growing a retrieval tree.
Each turn, first reason inside <think>...</think>. Then write sub-queries, each in its own tag:
- <base-Q>...</base-Q>: a question decomposed from the question and what you already know;
- <predicted-Q>...</predicted-Q>: a guess at the next hop's query,
  or <predicted-Q>{NO_PREDICTION}</predicted-Q> if you cannot predict one.
When every needed document has been found, write <base-Q>{STOP_QUERY}</base-Q> and
<predicted-Q>{NO_PREDICTION}</predicted-Q> instead of sub-queries.
End the turn with {END}. Each sub-query returns its single best document inside <information>."""


def parse_expansion(segment: str) -> Action:
    """Parse one expansion; malformed text is ``Action('format_error')``, never an exception.

    Sub-query blocks must be closed, non-empty and tag-free. A block reading ``stop retrieval``
    is the stop signal and one reading ``none`` is no query; the remaining blocks are the
    queries, in order. A stop beside real queries is an error, and so is ``stop retrieval``
    written outside the tags (the error names the tagged form). An unclosed ``<think>`` is
    tolerated here (the action is still readable); the reward treats it as missing.
    """
    parsed = parse_tags(segment, TAGS)
    problems = [e for e in parsed.errors if not e.startswith("unclosed: <think>")]
    if problems:
        return Action("format_error", error=problems[0])
    subs = [b for b in parsed.blocks if b.tag in KIND_OF_TAG]
    if any(not b.content or "<" in b.content for b in subs):
        return Action("format_error", error="a sub-query is empty or contains a tag")
    if _STOP_RE.search(outside_text(segment, parsed.blocks)):
        return Action(
            "format_error", error=f"write the stop as <base-Q>{STOP_QUERY}</base-Q>, inside the tag"
        )
    stops = [b for b in subs if _STOP_RE.fullmatch(b.content)]
    queries = [b for b in subs if b not in stops and not _NONE_RE.fullmatch(b.content)]
    if stops and queries:
        return Action("format_error", error="both sub-queries and a stop in one expansion")
    if stops:
        return Action("stop")
    if queries:
        kinds = [KIND_OF_TAG[b.tag] for b in queries]
        return Action("search", queries=[b.content for b in queries], query_kinds=kinds)
    return Action(
        "format_error", error=f"no sub-query: use <base-Q>/<predicted-Q> or <base-Q>{STOP_QUERY}</base-Q>"
    )


def render_information(docs: list[list[RetrievedDoc]]) -> str:
    """One line per sub-query's top-1 document, in sub-query order."""
    lines = [
        f"[{i}] " + (f"(Title: {r[0].title}) {r[0].text}" if r else "(no document)")
        for i, r in enumerate(docs, 1)
    ]
    return "\n<information>\n" + "\n".join(lines) + "\n</information>\n"


def stop_segment(thought: str) -> str:
    """A stop expansion in the paper's form."""
    stop = f"<base-Q>{STOP_QUERY}</base-Q>\n<predicted-Q>{NO_PREDICTION}</predicted-Q>"
    return f"<think>{thought}</think>\n{stop}\n{END}"


def expert_segments(question: Question) -> list[str]:
    """The scripted expert: one expansion with one base-Q per gold hop, then the stop."""
    hops = hops_for(question)
    queries = "\n".join(f"<base-Q>{hop.query}</base-Q>" for hop in hops)
    return [
        f"<think>The question needs {len(hops)} documents; one query each.</think>\n{queries}\n"
        f"<predicted-Q>{NO_PREDICTION}</predicted-Q>\n{END}",
        stop_segment("Every needed document is retrieved."),
    ]
