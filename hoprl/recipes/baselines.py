"""The two baselines every comparison table shows, and the tag protocol the other recipes extend.

- ``naive-rag``: one retrieval with the question before generation (the runner does it because the
  recipe sets ``retrieve_first = True``), then the answer in ``<answer>``; reward EM.
- ``search-r1``: ``<think>`` reasoning, ``<search>query</search>`` (the runner injects
  ``<information>...</information>`` as the next user turn), finally ``<answer>``; outcome reward
  EM only.

:class:`SearchR1` is also the base of ``eval-rar`` (adds ``<evaluate>`` after each information
turn) and ``when-to-search`` (adds ``<reflect>``): they override :attr:`SearchR1.review_tag`.

Rewards read ``episodes`` (one :class:`~hoprl.domain.Episode` per completion) when the
caller passes them, else the completion text: see :func:`generated_texts` and
:func:`final_answers`.

Expert completions (SFT warm start) are multi-turn: :meth:`SearchR1.expert_segments` returns the
assistant segments in order, each ending with the stop text that ends it (``</search>`` or
``</answer>``); :meth:`SearchR1.expert` joins them (the protocol's ``str`` shape), and splitting
after each stop string gives the segments back. Injected information is never part of it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from hoprl.data.synthetic import Hop, hops_for
from hoprl.domain import Action, Episode, Question, RetrievedDoc
from hoprl.metrics.answer import exact_match
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.parsing import parse_tags

# --- helpers shared by the tag recipes -------------------------------------------------------


def completion_text(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational form (a list of messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")


def generated_texts(completions: Sequence[Any], episodes: Sequence[Episode] | None = None) -> list[str]:
    """Policy-generated text per completion (never the injected ``<information>``).

    With ``episodes`` the step texts are joined; without, the completion text is used as it is.
    """
    if episodes is not None:
        return ["".join(s.text for s in e.steps) for e in episodes]
    return [completion_text(c) for c in completions]


def final_answers(completions: Sequence[Any], episodes: Sequence[Episode] | None = None) -> list[str]:
    """The final answer per completion: the episode's, else the last ``<answer>`` block ('' if none)."""
    if episodes is not None:
        return [e.final_answer or "" for e in episodes]
    out = []
    for c in completions:
        block = parse_tags(completion_text(c), ["answer"]).last("answer")
        out.append(block.content if block else "")
    return out


def gold_answers(
    n: int, answers: Sequence[list[str]] | None, episodes: Sequence[Episode] | None
) -> list[list[str]]:
    """Gold answers per completion from the ``answers`` column, else from the episodes."""
    if answers is not None:
        return [list(a) for a in answers]
    if episodes is not None:
        return [list(e.answers) for e in episodes]
    raise ValueError("rewards need gold answers: pass the `answers` column or `episodes`")


def format_docs(docs: list[list[RetrievedDoc]]) -> str:
    """Numbered references ``[1] title: text``, one per line, de-duplicated by id across queries."""
    seen: dict[str, RetrievedDoc] = {}
    for hits in docs:
        for d in hits:
            seen.setdefault(d.id, d)
    return "\n".join(f"[{i}] {d.title}: {d.text}" for i, d in enumerate(seen.values(), 1))


def lists_title(information: str, title: str) -> bool:
    """Whether a :func:`format_docs` text holds a reference titled ``title``."""
    return f"] {title}: " in information


@versioned("exact_match@1")
def exact_match_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    answers: Sequence[list[str]] | None = None,
    episodes: Sequence[Episode] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Outcome reward: normalised exact match of the final answer against any gold alias (1 or 0)."""
    preds = final_answers(completions, episodes)
    golds = gold_answers(len(preds), answers, episodes)
    return [exact_match(p, g) for p, g in zip(preds, golds, strict=True)]


# --- naive-rag ---------------------------------------------------------------------------------

NAIVE_RAG_PROMPT = (
    "You answer questions from the documents you are given. Read them, then write only the final "
    "answer, as short as possible, between <answer> and </answer>. Example: <answer>1912</answer>."
)


class NaiveRAGConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    top_k: int = 3
    system_prompt: str = NAIVE_RAG_PROMPT


class NaiveRAG:
    """Retrieve once with the question, answer once.

    Runner hooks: ``retrieve_first = True`` makes the runner search with ``question.question``
    before step 1 and call ``messages(question, docs=hits)`` to put the documents in the prompt;
    ``accept_truncated = True`` parses a segment cut at max_tokens like any other.

    As the plain baseline it takes the model's text as the answer: the ``<answer>`` block when
    there is one, else the text up to the first blank line. (The tag protocols of the RL recipes
    stay strict: their format rewards must see a missing tag.) An untrained model answers in whole
    sentences; token F1 still gives them partial credit, which is the baseline to beat.
    """

    name: ClassVar[str] = "naive-rag"
    stop: ClassVar[list[str]] = ["</answer>", "\n\n"]
    retrieve_first: ClassVar[bool] = True
    accept_truncated: ClassVar[bool] = True

    def __init__(self, **config: Any) -> None:
        self.config = NaiveRAGConfig(**config)
        self.top_k = self.config.top_k

    def messages(
        self, question: Question, docs: list[list[RetrievedDoc]] | None = None
    ) -> list[dict[str, str]]:
        refs = format_docs(docs or [])
        user = f"Question: {question.question}"
        if refs:
            user = f"Documents:\n{refs}\n\n{user}"
        return [{"role": "system", "content": self.config.system_prompt}, {"role": "user", "content": user}]

    def parse(self, segment: str) -> Action:
        parsed = parse_tags(segment, ["answer"])
        block = parsed.first("answer")
        if block is not None and block.content and not any(e.startswith("nested") for e in parsed.errors):
            return Action("answer", answer=block.content)
        plain = segment.replace("<answer>", "").replace("</answer>", "").strip().split("\n\n")[0].strip()
        if not plain:
            return Action("format_error", error="; ".join(parsed.errors) or "empty answer")
        return Action("answer", answer=plain)

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return f"<information>\n{format_docs(docs)}\n</information>"

    def reward_funcs(self) -> list[RewardFunc]:
        return [exact_match_reward]

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        return [f"<answer>{expert_answer(question)}</answer>"]

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))


# --- search-r1 ---------------------------------------------------------------------------------

SEARCH_R1_PROMPT = (
    "Answer the question by reasoning and searching. Reason inside <think> and </think> whenever you "
    "get new information. To look something up, write a query between <search> and </search>; the "
    "top results come back between <information> and </information>. Search as often as you need. "
    "When you know the answer, write it between <answer> and </answer> with no explanation, e.g. "
    "<answer>Lisbon</answer>."
)


class SearchR1Config(NaiveRAGConfig):
    """Naive RAG's settings (top-3) with Search-R1's prompt."""

    system_prompt: str = SEARCH_R1_PROMPT


def expert_answer(question: Question) -> str:
    """The gold answer, else the chain's last intermediate answer, else 'unknown'."""
    if question.answers:
        return question.answers[0]
    hops = hops_for(question)
    return next((h.answer for h in reversed(hops) if h.answer), "unknown")


def expert_plan(question: Question, noise: float, seed: int) -> list[tuple[str, Hop | None]]:
    """The expert's searches: one ``(query, hop)`` per gold hop, with noise.

    With probability ``noise`` each: a wrong first query (the last hop's query asked before its
    bridge entity is known; the question itself for one-hop chains), recorded with hop ``None``;
    and a redundant search repeating an earlier hop's query at a random later position.
    """
    rng = random.Random(seed)
    hops = hops_for(question)
    plan: list[tuple[str, Hop | None]] = [(h.query, h) for h in hops]
    if hops and rng.random() < noise:
        wrong = hops[-1].query if len(hops) > 1 else question.question
        plan.insert(0, (wrong, None))
    if hops and rng.random() < noise:
        query, hop = plan[rng.randrange(len(plan))]
        plan.insert(rng.randrange(1, len(plan) + 1), (query, hop))
    return plan


def expert_search(query: str, hop: Hop | None) -> str:
    """The expert's think + search block for one planned search."""
    need = f"I should look up {query}."
    if hop and hop.relation:
        need = f"I need the {hop.relation.replace('_', ' ')} of {hop.title}."
    return f"<think>{need}</think>\n<search>{query}</search>"


def expert_final(question: Question) -> str:
    """The expert's closing think + answer block."""
    answer = expert_answer(question)
    return f"<think>The evidence gives the answer: {answer}.</think>\n<answer>{answer}</answer>"


def hop_fact(hop: Hop | None) -> str:
    """One sentence stating what a hop's evidence gave (used in think/evaluate/reflect text).

    No hop (a wrong search) or a known relation without an answer (a synthetic fact that was
    withheld) gave nothing. A real benchmark's bridge hop has neither relation nor intermediate
    answer (:func:`hoprl.data.synthetic.hops_for`): its page is the lead, not a dead end.
    """
    if hop is None or (hop.answer is None and hop.relation):
        return "These results do not give what I need."
    if hop.answer is None:
        return f"{hop.title} is relevant to the question."
    return f"From {hop_statement(hop, 'fact I need')}"


def hop_statement(hop: Hop, unnamed: str) -> str:
    """``"<title>: the <relation> is <answer>."`` for a hop with an answer; ``unnamed`` stands in
    for an unknown relation."""
    what = hop.relation.replace("_", " ") if hop.relation else unnamed
    return f"{hop.title}: the {what} is {(hop.answer or '').rstrip('.')}."


class SearchR1:
    """Search-R1: think, search, read the injected information, answer; EM outcome reward."""

    name: ClassVar[str] = "search-r1"
    stop: ClassVar[list[str]] = ["</search>", "</answer>"]
    #: tag the policy writes right after each information turn ('' = none); subclasses set it
    review_tag: ClassVar[str] = ""
    tags: ClassVar[list[str]] = ["think", "search", "answer", "information"]

    def __init__(self, **config: Any) -> None:
        self.config = SearchR1Config(**config)
        self.top_k = self.config.top_k

    def messages(self, question: Question) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": f"Question: {question.question}"},
        ]

    def parse(self, segment: str) -> Action:
        """The first ``<search>`` or ``<answer>`` block decides the action (unclosed at the end is
        accepted: the segment was cut at a stop sequence); nesting or no action is a format error."""
        parsed = parse_tags(segment, self.tags)
        if any(e.startswith(("nested", "too_long")) for e in parsed.errors):
            return Action("format_error", error="; ".join(parsed.errors))
        block = next((b for b in parsed.blocks if b.tag in ("search", "answer")), None)
        if block is None or not block.content:
            return Action("format_error", error="no non-empty <search> or <answer> block")
        if block.tag == "search":
            return Action("search", queries=[block.content], query_kinds=["search"])
        return Action("answer", answer=block.content)

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return f"<information>\n{format_docs(docs)}\n</information>"

    def reward_funcs(self) -> list[RewardFunc]:
        return [exact_match_reward]

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """Assistant segments of a scripted expert, in order (see the module docstring)."""
        plan = expert_plan(question, noise, seed)
        segments, previous = [], None
        for i, (query, hop) in enumerate(plan):
            segments.append(self._review(previous, i) + expert_search(query, hop))
            previous = hop
        segments.append(self._review(previous, len(plan)) + expert_final(question))
        return segments

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))

    def _review(self, hop: Hop | None, index: int) -> str:
        """The block written right after an information turn (none before the first search)."""
        if not self.review_tag or index == 0:
            return ""
        return f"<{self.review_tag}>{hop_fact(hop)}</{self.review_tag}>\n"
