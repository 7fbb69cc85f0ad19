"""ARENA: a single-turn generator that cites, explains and answers over given references.

The prompt is Table 1's: the system turn is its instruction, the user turn
``<question>...</question>`` and ``<references>...</references>``, the references the question's own
paragraphs numbered ``[1] title: text`` (in the order the question carries them). The policy
writes, in one turn::

    <relevance>[1,5]</relevance><analysis>...</analysis><answer>...</answer>

Rewards (each its own function; the paper's total is their sum):

- format (§3.3): 1 if the output consists of the ``<relevance>``, ``<analysis>`` and ``<answer>``
  parts in order (each once and closed, Table 1's "EXACTLY three sections"); else 0. Text around
  the parts and a list without brackets do not cost the reward. ``format_check="strict"`` is the
  project's earlier reading: nothing but whitespace around the blocks, a bracketed list of
  integers in ``<relevance>`` and a non-empty answer.
- accuracy: normalised exact match of the answer against any gold answer or alias (1 or 0),
  normalised as the paper's evaluation does it (App. C.1, :func:`normalize_arena`): lowercase,
  punctuation and the articles a/an/the removed, underscores replaced by spaces, spaces collapsed.
  ``answer_norm="squad"`` uses the SQuAD normalisation of :mod:`hoprl.metrics.answer` instead (it
  deletes underscores with the punctuation: "new_york" is "newyork" there, "new york" here).
- relevance: 1 if the cited set equals the gold set, 0.5 if they overlap partially, 0 if they are
  disjoint or nothing is cited. The gold set is the 1-based positions of the ``is_gold``
  paragraphs, read from the ``paragraphs`` column passed to the reward.
- bonus: 10 when format, accuracy and relevance are all exactly 1, else 0.

The references are the question's own paragraphs (the paper's setting: the datasets' 10
paragraphs for HotpotQA and 2WikiMultiHopQA, Table 2). A question that brings none (an
application's bare question to ``/v1/answer``) gets ``top_k`` = 10 references retrieved with the
question before the single turn (the runner's ``retrieve_first = "without_references"``), numbered
the same way. :meth:`Arena.cited_sources` gives ``/v1/answer`` the references the answer names in
``<relevance>`` (a given paragraph, or a retrieved document), never the ones it left out.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from hoprl.data.synthetic import hops_for
from hoprl.domain import Action, Episode, Paragraph, Question, RetrievedDoc
from hoprl.metrics.answer import exact_match
from hoprl.recipes.base import RewardFunc, versioned
from hoprl.recipes.baselines import (
    expert_answer,
    final_answers,
    format_docs,
    generated_texts,
    gold_answers,
    hop_statement,
)
from hoprl.recipes.parsing import outside_text, parse_tags

TAGS = ["relevance", "analysis", "answer"]
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# App. C.1 lists underscore replacement as its own step, so "_" is a space, not punctuation
_PUNCTUATION = frozenset(string.punctuation) - {"_"}
_REF_LIST = re.compile(r"\[\s*(\d+\s*(,\s*\d+\s*)*)?\]")

#: Table 1's instruction, as the paper prints it (the user turn carries the question and the
#: references in the tags it names); it shows no example answer a model could repeat
ARENA_PROMPT = (
    "A conversation between User and Assistant. The user asks a question and gives some references. "
    "The assistant should answer the question based on the references.\n"
    "User's input will always contain:\n"
    "<question>[ the question to answer ]</question>\n"
    "<references>[ references starting with numbers ]</references>\n"
    "Assistant's response must contain EXACTLY three sections:\n"
    "<relevance> [list ONLY reference numbers that provide useful information in square brackets, "
    "e.g. [1,5]]</relevance>\n"
    "<analysis>[ combine information from relevant references to build the answer. Explicitly "
    "mention which references support each claim ]</analysis>\n"
    "<answer>[ answer with ONLY a short phrase or single word. no explanations ]</answer>"
)


class ArenaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    system_prompt: str = ARENA_PROMPT
    top_k: int = 10  # references retrieved for a question without its own (Table 2: 10 paragraphs)
    format_score: float = 1.0
    accuracy_score: float = 1.0
    relevance_full: float = 1.0
    relevance_partial: float = 0.5
    bonus: float = 10.0
    #: the accuracy reward's normalisation: the paper's (App. C.1) or SQuAD's
    answer_norm: Literal["arena", "squad"] = "arena"
    #: the format reward's rule: §3.3's (three parts in order) or the earlier, stricter one
    format_check: Literal["paper", "strict"] = "paper"


def normalize_arena(text: str) -> str:
    """ARENA's answer normalisation (App. C.1): lowercase, remove punctuation and articles,
    replace underscores with spaces, collapse multiple spaces.

    >>> normalize_arena("The New_York  Times!")
    'new york times'
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION).replace("_", " ")
    return " ".join(_ARTICLES.sub(" ", text).split())


def arena_exact_match(prediction: str, answers: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer or alias (App. C.1)."""
    pred = normalize_arena(prediction)
    return max((float(pred == normalize_arena(a)) for a in answers), default=0.0)


def cited(text: str) -> set[int]:
    """Reference numbers in the first ``<relevance>`` block (empty set if there is none)."""
    block = parse_tags(text, TAGS).first("relevance")
    return {int(n) for n in re.findall(r"\d+", block.content)} if block else set()


def gold_refs(paragraphs: Sequence[Paragraph | dict[str, Any]]) -> set[int]:
    """1-based positions of the gold paragraphs, as numbered in the prompt."""
    flags = [p.is_gold if isinstance(p, Paragraph) else bool(p.get("is_gold")) for p in paragraphs]
    return {i for i, gold in enumerate(flags, 1) if gold}


def well_formed(text: str, check: Literal["paper", "strict"] = "paper") -> bool:
    """The format rule of the module docstring: §3.3's, or the earlier ``"strict"`` one."""
    parsed = parse_tags(text, TAGS)
    if not parsed.ok or parsed.tags != TAGS:
        return False
    if check == "paper":
        return True
    if outside_text(text, parsed.blocks):
        return False
    relevance, _, answer = parsed.blocks
    return bool(_REF_LIST.fullmatch(relevance.content)) and bool(answer.content)


def relevance_match(predicted: set[int], gold: set[int]) -> str:
    """``"full"`` exact set match, ``"partial"`` some overlap, ``"none"`` disjoint or nothing cited."""
    if predicted and predicted == gold:
        return "full"
    return "partial" if predicted & gold else "none"


def expert_analysis(question: Question) -> str:
    """The expert's ``<analysis>``: each gold hop in chain order, by its reference number.

    A hop with a known fact states it (``[4] Acme: the founded by is Jane Roe.``); a real
    benchmark's bridge hop, whose intermediate answer is unknown, is named only
    (``[3] is about Dear Brother.``), and its last hop gives the gold answer.
    """
    position = {p.title: i for i, p in enumerate(question.paragraphs, 1)}
    parts = []
    for hop in hops_for(question):
        ref = f"[{position[hop.title]}]" if hop.title in position else hop.title
        if hop.answer is None:
            parts.append(f"{ref} is about {hop.title}.")
        else:
            parts.append(f"{ref} {hop_statement(hop, 'answer')}")
    return " ".join(parts) or "The references state the answer."


def make_arena_rewards(config: ArenaConfig | None = None) -> list[RewardFunc]:
    """The four ARENA reward functions ``[format, accuracy, relevance, bonus]``; their sum is R."""
    cfg = config or ArenaConfig()
    rel_score = {"full": cfg.relevance_full, "partial": cfg.relevance_partial, "none": 0.0}
    match = arena_exact_match if cfg.answer_norm == "arena" else exact_match

    def _parts(completions: Sequence[Any], kw: dict[str, Any]) -> list[tuple[bool, bool, str]]:
        """Per completion: (well formed, exact match, relevance match)."""
        episodes: Sequence[Episode] | None = kw.get("episodes")
        paragraphs = kw.get("paragraphs")
        if paragraphs is None:
            raise ValueError("ARENA rewards need the `paragraphs` column (the numbered references)")
        texts = generated_texts(completions, episodes)
        preds = final_answers(completions, episodes)
        golds = gold_answers(len(texts), kw.get("answers"), episodes)
        return [
            (well_formed(t, cfg.format_check), match(p, g) == 1.0, relevance_match(cited(t), gold_refs(ps)))
            for t, p, g, ps in zip(texts, preds, golds, paragraphs, strict=True)
        ]

    @versioned("arena_format@2")
    def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[float | None]:
        return [cfg.format_score if f else 0.0 for f, _, _ in _parts(completions, kw)]

    @versioned("arena_accuracy@2")
    def accuracy_reward(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[float | None]:
        return [cfg.accuracy_score if a else 0.0 for _, a, _ in _parts(completions, kw)]

    @versioned("arena_relevance@1")
    def relevance_reward(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[float | None]:
        return [rel_score[r] for _, _, r in _parts(completions, kw)]

    @versioned("arena_bonus@2")
    def bonus_reward(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[float | None]:
        return [cfg.bonus if f and a and r == "full" else 0.0 for f, a, r in _parts(completions, kw)]

    return [format_reward, accuracy_reward, relevance_reward, bonus_reward]


def make_arena_reward(config: ArenaConfig | None = None) -> RewardFunc:
    """The total R = format + accuracy + relevance + bonus, as one function."""
    parts = make_arena_rewards(config)

    @versioned("arena@3")
    def arena_reward(prompts: Sequence[Any], completions: Sequence[Any], **kw: Any) -> list[float | None]:
        columns = [fn(prompts, completions, **kw) for fn in parts]
        return [sum(v or 0.0 for v in row) for row in zip(*columns, strict=True)]

    return arena_reward


class Arena:
    """ARENA's single-turn protocol over the question's own paragraphs."""

    name: ClassVar[str] = "arena"
    stop: ClassVar[list[str]] = ["</answer>"]
    retrieve_first: ClassVar[str] = "without_references"  # hoprl.agent.runner's hook

    def __init__(self, **config: Any) -> None:
        self.config = ArenaConfig(**config)
        self.top_k = self.config.top_k

    def messages(
        self, question: Question, docs: list[list[RetrievedDoc]] | None = None
    ) -> list[dict[str, str]]:
        """Table 1's user turn: the question and the numbered references (the question's
        paragraphs, else the retrieved ``docs``) in their tags."""
        refs = (
            format_docs(docs)
            if docs
            else "\n".join(f"[{i}] {p.title}: {p.text}" for i, p in enumerate(question.paragraphs, 1))
        )
        user = f"<question>{question.question}</question>\n<references>\n{refs}\n</references>"
        return [{"role": "system", "content": self.config.system_prompt}, {"role": "user", "content": user}]

    def parse(self, segment: str) -> Action:
        """Any non-empty ``<answer>`` ends the episode; the format reward judges the rest."""
        parsed = parse_tags(segment, TAGS)
        block = parsed.last("answer")
        if block is None or not block.content:
            return Action("format_error", error="; ".join(parsed.errors) or "no <answer> block")
        return Action("answer", answer=block.content)

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return f"<information>\n{format_docs(docs)}\n</information>"

    def cited_sources(self, episode: Episode, question: Question) -> list[tuple[str, str]]:
        """``(doc_id, title)`` of each reference the answer names in ``<relevance>``, in number
        order: a given paragraph is ``paragraph:<n>``, a retrieved reference its document id.
        Numbers that name no reference are left out."""
        numbers = sorted(cited("".join(s.text for s in episode.steps)))
        if question.paragraphs:
            refs = [(f"paragraph:{i}", p.title) for i, p in enumerate(question.paragraphs, 1)]
        else:
            first = episode.steps[0].docs if episode.steps else []
            unique = {d.id: d for hits in first for d in hits}  # format_docs' numbering
            refs = [(d.id, d.title) for d in unique.values()]
        return [refs[n - 1] for n in numbers if 1 <= n <= len(refs)]

    def reward_funcs(self) -> list[RewardFunc]:
        """``[format, accuracy, relevance, bonus]``: TRL sums them into R and logs each."""
        return make_arena_rewards(self.config)

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """One segment: the gold references, the hop facts as analysis, the answer.

        With probability ``noise`` one non-gold reference is cited as well (a partial match).
        """
        rng = random.Random(seed)
        refs = gold_refs(question.paragraphs)
        others = sorted(set(range(1, len(question.paragraphs) + 1)) - refs)
        if others and rng.random() < noise:
            refs = refs | {rng.choice(others)}
        analysis = expert_analysis(question)
        ref_list = "[" + ",".join(str(i) for i in sorted(refs)) + "]"
        answer = expert_answer(question)
        return [
            f"<relevance>{ref_list}</relevance>\n<analysis>{analysis}</analysis>\n<answer>{answer}</answer>"
        ]

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return self.expert_segments(question, noise, seed)[0]
