"""R2AG: a retrieval tree of base and predicted sub-queries, scored by the Top-Survivor reward.

Each *expansion* (one policy turn) reasons, then either proposes sub-queries or stops::

    <think>...</think>
    <base-Q>a query decomposed from the question</base-Q>
    <predicted-Q>a query that guesses the next hop</predicted-Q>
    <end/>

    <think>...</think> stop retrieval <end/>          (or ``none``: nothing left to ask)

The retriever returns the top-1 document per sub-query. Each step t gets four signals
(:func:`score_episode`), and the sequence reward is the Top-Survivor reward
``R = a R_MH + b R_JH + g R_AP + w R_f = sum_t (a r_mh + b r_jh + g r_ap + w r_f)``:

r_mh  Multi-Hit@Top-1. Gold documents hit for the first time in the episode by this expansion's
      top-1 results, each weighted 1, or ``l`` (1.25) when a predicted-Q hit it, the sum divided
      by the number of gold documents: ``r_mh = sum_{g new} w_g / |G|``. A document hit by
      several sub-queries counts once. An episode that finds every gold document through base
      queries collects ``sum_t r_mh = 1``.
r_jh  Joint-Hit@Top-1: 1 on the stop step if every gold document has been retrieved, else 0.
r_ap  top-t/x average precision over the expansion's branches. Each sub-query is a branch; the
      base branches are ranked in emission order and cut at ``t`` (4), the predicted ones
      likewise at ``x`` (2). A branch is relevant when its top-1 document is a gold document not
      found before this expansion and not already credited to a higher-ranked branch of the
      same ranking. ``AP@k = (1/min(k, m)) sum_{i<=k} P@i rel_i`` with ``m`` the gold documents
      still missing before this expansion (AP is 0 when none are missing). ``r_ap`` is the mean
      AP over the kinds the expansion used (base, predicted or both).
r_f   format: 0.01 per well-formed block (a closed, non-empty ``<think>``, ``<base-Q>`` or
      ``<predicted-Q>``). The whole R_f of the episode is 0 if any step lacks ``<think>`` or if
      the episode stops before every gold document is found.

Progressive iterative training grows a :class:`RetrievalTree` per question one level at a time
(:func:`expand`), prunes it to its gold-hit branches (:func:`prune`) and shows the survivors to
the next iteration (:func:`context`), up to ``L_MAX`` levels. An expansion scored in that loop
passes the gold titles the tree already holds (:meth:`RetrievalTree.found_titles`) as
``episode.meta["found_titles"]``, so "new" means new to the tree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from hoprl.agent.parsing import parse_tags
from hoprl.agent.trajectory import Episode, RetrievedDoc, Step
from hoprl.data.synthetic import hops_for
from hoprl.recipes.base import Action, RewardFunc, versioned
from hoprl.recipes.rewards import (
    episode_reward,
    normalize_title,
    sequence_reward,
    signal_total,
    step_rewards,
)
from hoprl.schemas import Question

SIGNALS = ("r_mh", "r_jh", "r_ap", "r_f")
SCORE_VERSION = "r2ag@1"
L_MAX = 5
TAGS = ("think", "base-Q", "predicted-Q")
KIND_OF_TAG = {"base-Q": "base", "predicted-Q": "predicted"}
_STOP_RE = re.compile(r"(stop retrieval|none)\W*", re.IGNORECASE)


class R2agConfig(BaseModel):
    """Top-Survivor weights and cut-offs (the paper's defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a: float = Field(default=0.2, description="weight of Multi-Hit@Top-1")
    b: float = Field(default=0.3, description="weight of Joint-Hit@Top-1")
    g: float = Field(default=0.2, description="weight of top-t/x average precision")
    w: float = Field(default=1.0, description="weight of the format reward")
    l: float = Field(default=1.25, description="Multi-Hit weight of a gold hit by a predicted query")  # noqa: E741
    t_base: int = Field(default=4, ge=1, description="AP cut-off over base-query branches")
    t_pred: int = Field(default=2, ge=1, description="AP cut-off over predicted-query branches")
    format_bonus: float = Field(default=0.01, description="R_f per well-formed block")
    l_max: int = Field(default=L_MAX, ge=1, description="tree levels in progressive training")

    def weights(self) -> dict[str, float]:
        return {"r_mh": self.a, "r_jh": self.b, "r_ap": self.g, "r_f": self.w}


# --- reward pieces --------------------------------------------------------------------------


def average_precision(relevant: Sequence[bool], cutoff: int, missing: int) -> float:
    """``AP@k = (1/min(k, m)) * sum_{i<=k} P@i * rel_i``; 0 when ``m`` (missing gold) is 0.

    >>> average_precision([True, False, True], cutoff=4, missing=2)  # (1/1 + 2/3) / 2
    0.8333333333333333
    """
    denominator = min(cutoff, missing)
    if denominator == 0:
        return 0.0
    hits, total = 0, 0.0
    for rank, rel in enumerate(relevant[:cutoff], 1):
        if rel:
            hits += 1
            total += hits / rank
    return total / denominator


def _kinds(step: Step) -> list[str]:
    """Per query its kind; a step recorded without kinds is all base queries."""
    return step.query_kinds or ["base"] * len(step.queries)


def _top1_gold(step: Step, gold: set[str]) -> list[str | None]:
    """Per sub-query, the normalised gold title of its top-1 document, or None."""
    out: list[str | None] = []
    for ranked in step.docs:
        title = normalize_title(ranked[0].title) if ranked else ""
        out.append(title if title in gold else None)
    return out


def multi_hit(step: Step, gold: set[str], found: set[str], lam: float) -> float:
    """Multi-Hit@Top-1 of one expansion: ``sum over new gold docs of (l if predicted else 1) / |G|``."""
    if not gold:
        return 0.0
    weight: dict[str, float] = {}
    for kind, title in zip(_kinds(step), _top1_gold(step, gold), strict=False):
        if title is not None and title not in found:
            weight[title] = max(weight.get(title, 0.0), lam if kind == "predicted" else 1.0)
    return sum(weight.values()) / len(gold)


def branch_ap(step: Step, gold: set[str], found: set[str], config: R2agConfig) -> float:
    """Mean over the kinds present of AP@t_base (base branches) and AP@t_pred (predicted)."""
    titles = _top1_gold(step, gold)
    missing = len(gold - found)
    aps = []
    for kind, cutoff in (("base", config.t_base), ("predicted", config.t_pred)):
        ranking = [t for k, t in zip(_kinds(step), titles, strict=False) if k == kind]
        if not ranking:
            continue
        credited: set[str] = set()
        relevant = []
        for title in ranking:
            relevant.append(title is not None and title not in found and title not in credited)
            if title is not None:
                credited.add(title)
        aps.append(average_precision(relevant, cutoff, missing))
    return sum(aps) / len(aps) if aps else 0.0


def well_formed_blocks(text: str) -> tuple[int, bool]:
    """(number of closed, non-empty think/base-Q/predicted-Q blocks, whether a think is among them)."""
    parsed = parse_tags(text, TAGS)
    good = [b for b in parsed.blocks if b.closed and b.content]
    return len(good), any(b.tag == "think" for b in good)


# --- scoring --------------------------------------------------------------------------------


def score_episode(episode: Episode, config: R2agConfig | None = None) -> Episode:
    """A copy of ``episode`` with ``r_mh``, ``r_jh``, ``r_ap`` and ``r_f`` on every step (pure)."""
    cfg = config or R2agConfig()
    scored = episode.model_copy(deep=True)
    gold = {normalize_title(t) for t in scored.gold_titles}
    found = {normalize_title(t) for t in scored.meta.get("found_titles", [])} & gold
    think_missing = premature_stop = False
    for step in scored.steps:
        signals = dict.fromkeys(SIGNALS, 0.0)
        blocks, has_think = well_formed_blocks(step.text)
        think_missing |= not has_think
        if step.action == "search":
            signals["r_mh"] = multi_hit(step, gold, found, cfg.l)
            signals["r_ap"] = branch_ap(step, gold, found, cfg)
            found |= {t for t in _top1_gold(step, gold) if t is not None}
        elif step.action == "stop":
            signals["r_jh"] = 1.0 if found >= gold else 0.0
            premature_stop |= not found >= gold
        if step.action != "format_error":
            signals["r_f"] = cfg.format_bonus * blocks
        step.signals = signals
    if think_missing or premature_stop:
        for step in scored.steps:
            step.signals["r_f"] = 0.0
    scored.meta["r2ag"] = {
        "version": SCORE_VERSION,
        "found": sorted(found),
        "format_zeroed": (
            "missing <think>" if think_missing else "stop before all gold found" if premature_stop else None
        ),
    }
    return scored


def episode_return(episode: Episode, config: R2agConfig | None = None) -> float:
    """Top-Survivor reward ``R`` of a scored episode."""
    weights = (config or R2agConfig()).weights()
    return sequence_reward(episode, lambda t: weights)


def episode_step_rewards(episode: Episode, config: R2agConfig | None = None) -> list[float]:
    """Per-step ``R_t`` of a scored episode."""
    weights = (config or R2agConfig()).weights()
    return step_rewards(episode, lambda t: weights)


def make_reward_funcs(config: R2agConfig) -> list[RewardFunc]:
    """The Top-Survivor total first, then one logging reward per signal.

    Unscored episodes are scored in place on first use (scoring is deterministic and cheap).
    """

    def scored(ep: Episode) -> Episode:
        if "r2ag" not in ep.meta:
            done = score_episode(ep, config)
            ep.steps, ep.meta = done.steps, done.meta
        return ep

    total = versioned("r2ag_total@1")(episode_reward(lambda ep: episode_return(scored(ep), config)))
    return [total, *(_signal_reward(name, scored) for name in SIGNALS)]


def _signal_reward(name: str, scored: Callable[[Episode], Episode]) -> RewardFunc:
    return versioned(f"r2ag_{name}@1")(episode_reward(lambda ep: signal_total(scored(ep), name)))


# --- the forest -----------------------------------------------------------------------------


@dataclass
class Node:
    """One sub-query, its kind ('base' / 'predicted'; 'question' for the root) and top-1 doc."""

    query: str
    kind: str
    doc: RetrievedDoc | None = None
    children: list[Node] = field(default_factory=list)
    closed: bool = False  # the policy stopped (or failed to parse) when asked to expand it

    def hits(self, gold: set[str]) -> bool:
        return self.doc is not None and normalize_title(self.doc.title) in gold


@dataclass
class RetrievalTree:
    """A question's retrieval tree; the root is the question, each level one expansion."""

    question: str
    gold_titles: list[str]
    root: Node

    @classmethod
    def for_question(cls, question: Question) -> RetrievalTree:
        return cls(question.question, list(question.gold_titles), Node(question.question, "question"))

    def frontier(self, l_max: int = L_MAX) -> list[Node]:
        """Open leaves above depth ``l_max``, depth-first: the nodes the next level expands."""
        out: list[Node] = []

        def walk(node: Node, depth: int) -> None:
            if node.children:
                for child in node.children:
                    walk(child, depth + 1)
            elif not node.closed and depth < l_max:
                out.append(node)

        walk(self.root, 0)
        return out

    def found_titles(self) -> list[str]:
        """Gold titles retrieved anywhere in the tree (for ``episode.meta['found_titles']``)."""
        gold = {normalize_title(t) for t in self.gold_titles}
        found: list[str] = []

        def walk(node: Node) -> None:
            if node.hits(gold):
                found.append(normalize_title(node.doc.title))  # type: ignore[union-attr]
            for child in node.children:
                walk(child)

        walk(self.root)
        return sorted(set(found))


Forest = list[RetrievalTree]


def expand(forest: Forest, level_outputs: Sequence[Sequence[Step]], l_max: int = L_MAX) -> int:
    """Add one level: ``level_outputs[i]`` holds one expansion per node of ``forest[i].frontier()``.

    A search expansion adds one child per sub-query (with its top-1 document); a stop or a
    format error closes the leaf. Returns the number of nodes added.
    """
    if len(level_outputs) != len(forest):
        raise ValueError(f"{len(level_outputs)} output lists for {len(forest)} trees")
    added = 0
    for tree, outputs in zip(forest, level_outputs, strict=True):
        leaves = tree.frontier(l_max)
        if len(outputs) != len(leaves):
            raise ValueError(
                f"{len(outputs)} expansions for {len(leaves)} frontier nodes of {tree.question!r}"
            )
        for leaf, step in zip(leaves, outputs, strict=True):
            if step.action != "search":
                leaf.closed = True
                continue
            for query, kind, ranked in zip(step.queries, _kinds(step), step.docs, strict=True):
                leaf.children.append(Node(query, kind, ranked[0] if ranked else None))
                added += 1
    return added


def prune(tree: RetrievalTree, gold_titles: Sequence[str] | None = None) -> RetrievalTree:
    """A copy keeping exactly the branches (root-to-leaf paths) with a gold hit on some node.

    A node survives if it or an ancestor hit gold (every branch through it has a hit), or if a
    descendant did (it lies on such a branch). ``gold_titles`` defaults to the tree's own.
    """
    gold = {normalize_title(t) for t in (tree.gold_titles if gold_titles is None else gold_titles)}

    def keep(node: Node, hit_above: bool) -> Node | None:
        hit = hit_above or node.hits(gold)
        children = [c for c in (keep(child, hit) for child in node.children) if c is not None]
        if not (hit or children):
            return None
        return Node(node.query, node.kind, node.doc, children, node.closed)

    kept = [c for c in (keep(child, False) for child in tree.root.children) if c is not None]
    root = Node(tree.root.query, tree.root.kind, None, kept, tree.root.closed)
    return RetrievalTree(tree.question, list(tree.gold_titles), root)


def context(tree: RetrievalTree) -> str:
    """The tree's branches as indented text, one line per node, for the next iteration's prompt."""
    lines: list[str] = []

    def walk(node: Node, depth: int) -> None:
        doc = f"{node.doc.title}: {node.doc.text}" if node.doc else "(nothing retrieved)"
        lines.append(f"{'  ' * depth}- [{node.kind}] {node.query} -> {doc}")
        for child in node.children:
            walk(child, depth + 1)

    for child in tree.root.children:
        walk(child, 0)
    return "\n".join(lines)


# --- protocol -------------------------------------------------------------------------------

SYSTEM_PROMPT = """You find the documents that answer a multi-hop question by growing a retrieval tree.
Each turn, reason inside <think>...</think>, then either:
- write sub-queries, each in its own tag: <base-Q>...</base-Q> for a question decomposed from what
  you know, <predicted-Q>...</predicted-Q> for a guess at the next hop; or
- write `stop retrieval` when every needed document has been found (`none` if nothing is left to ask).
End the turn with <end/>. Each sub-query returns its single best document inside <information>."""


def parse_expansion(segment: str) -> Action:
    """Parse one expansion; malformed text is ``Action('format_error')``, never an exception.

    Sub-query blocks must be closed, non-empty and tag-free. A stop is ``stop retrieval`` or
    ``none`` as the only text outside the blocks (so a "none" in stray prose is no stop);
    sub-queries and a stop together are an error. An unclosed ``<think>`` is tolerated here
    (the action is still readable); the format reward withholds its 0.01.
    """
    parsed = parse_tags(segment, TAGS)
    problems = [e for e in parsed.errors if not e.startswith("unclosed: <think>")]
    if problems:
        return Action("format_error", error=problems[0])
    subs = [b for b in parsed.blocks if b.tag in KIND_OF_TAG]
    outside = segment
    for b in sorted(parsed.blocks, key=lambda b: -b.start):
        outside = outside[: b.start] + " " + outside[b.end :]
    rest = outside.replace("<end/>", " ").strip()
    if subs and "stop retrieval" in rest.lower():
        return Action("format_error", error="both sub-queries and a stop in one expansion")
    if not subs and _STOP_RE.fullmatch(rest):
        return Action("stop")
    if not subs:
        return Action("format_error", error="no sub-query: use <base-Q>/<predicted-Q> or `stop retrieval`")
    if any(not b.content or "<" in b.content for b in subs):
        return Action("format_error", error="a sub-query is empty or contains a tag")
    return Action("search", queries=[b.content for b in subs], query_kinds=[KIND_OF_TAG[b.tag] for b in subs])


def render_information(docs: list[list[RetrievedDoc]]) -> str:
    """One line per sub-query's top-1 document, in sub-query order."""
    lines = [
        f"[{i}] " + (f"(Title: {r[0].title}) {r[0].text}" if r else "(no document)")
        for i, r in enumerate(docs, 1)
    ]
    return "\n<information>\n" + "\n".join(lines) + "\n</information>\n"


class R2ag:
    """The ``r2ag`` recipe: tree protocol, Top-Survivor rewards, expert."""

    name: ClassVar[str] = "r2ag"
    stop: ClassVar[list[str]] = ["<end/>"]
    top_k: ClassVar[int] = 1

    def __init__(self, **config: Any) -> None:
        self.config = R2agConfig(**config)
        self.max_steps = self.config.l_max + 1  # L_MAX expansions, then the stop

    def messages(self, question: Question) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Question: {question.question}"},
        ]

    def parse(self, segment: str) -> Action:
        return parse_expansion(segment)

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        return render_information(docs)

    def reward_weights(self) -> list[float]:
        """Only the total is optimised; the per-signal rewards after it are logged (weight 0)."""
        return [1.0] + [0.0] * len(SIGNALS)

    def reward_funcs(self) -> list[RewardFunc]:
        return make_reward_funcs(self.config)

    def score(self, episode: Episode) -> Episode:
        return score_episode(episode, self.config)

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """One expansion with one base-Q per gold hop, then ``stop retrieval``.

        ``noise`` and ``seed`` are accepted for interface parity; the R2AG expert is exact.
        """
        hops = hops_for(question)
        queries = "\n".join(f"<base-Q>{hop.query}</base-Q>" for hop in hops)
        return [
            f"<think>The question needs {len(hops)} documents; one query each.</think>\n{queries}\n<end/>",
            "<think>Every needed document is retrieved.</think>\nstop retrieval\n<end/>",
        ]

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        return "".join(self.expert_segments(question, noise, seed))
