"""R2AG's Reasoning-Augmented Retrieval Forest (RR-Forest) as Algorithm 1 grows it.

Algorithm 1 (R2AG RL Training; App. B.1) starts from one tree per training question, the root
alone (``RRT_u^0 = ({v_0}, {})``, ``v_0 = {q_u, {}}``). At level ``j`` each tree of
``RR-Forest^j`` is one prompt, ``q_u ⊕ d~^j`` (the question and the documents its tree holds:
:func:`documents`), and the policy samples ``G`` responses to it. Response ``i`` extends the tree
with a vertex per sub-query and its top-1 document (:func:`expand`: ``RRT_u^j ∪^e {(q~_b, r~_b)}
∪^e {(q~_p, r~_p)}``), which makes a new tree ``RRT_{u_i}^{j+1}``. Then:

- **a finished tree leaves the forest**: when every gold document is in the tree and the response
  stops (``|r~^{j+1} ∩ g_u| = |g_u|`` and stop; :func:`finished`);
- **every other tree is pruned and kept** (``RRT_{u_i}^{j+1}(g~) <- pruning``): only the branches
  whose documents are gold survive (:func:`prune`), and the pruned tree joins ``RR-Forest^{j+1}``,
  even when nothing survived (the root alone: "RRTs that ... contain no accurate branches at all
  (i.e., only the root node) are propagated", App. B.1) and when the response stopped early
  (its reward is 0; the tree, short of gold, is expanded again at the next level);
- ``RR-Forest^{j+1}`` is a set (``∪``): identical trees of a question are kept once
  (:func:`grow_forest`, :func:`survivors`). ``forest_width`` (an option; the paper keeps every
  tree) caps the trees per question, the ones holding the most gold first.

New vertices hang under the tree's *tip*, its deepest vertex (the root while it has none), so a
tree is the chain of gold hits its samples found level by level; the prompt only reads the
tree's documents, so the shape matters for :func:`context` and nothing else.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hoprl.domain import Question, RetrievedDoc, Step
from hoprl.recipes.rewards import normalize_title


@dataclass
class Node:
    """One sub-query, its kind ('base' / 'predicted'; 'question' for the root) and top-1 doc."""

    query: str
    kind: str
    doc: RetrievedDoc | None = None
    children: list[Node] = field(default_factory=list)

    def hits(self, gold: set[str]) -> bool:
        return self.doc is not None and normalize_title(self.doc.title) in gold

    def key(self) -> tuple[Any, ...]:
        """What makes two subtrees the same: queries, kinds, documents and children."""
        return (self.query, self.kind, self.doc.id if self.doc else None,
                tuple(c.key() for c in self.children))  # fmt: skip


@dataclass
class RetrievalTree:
    """A question's retrieval tree (an RRT); the root is the question."""

    question: str
    gold_titles: list[str]
    root: Node
    question_id: str = ""

    @classmethod
    def for_question(cls, question: Question) -> RetrievalTree:
        """``RRT^0``: the root alone."""
        root = Node(question.question, "question")
        return cls(question.question, list(question.gold_titles), root, question.id)

    def nodes(self) -> list[tuple[Node, int]]:
        """Every vertex below the root with its depth (1 = a child of the root), depth-first."""
        out: list[tuple[Node, int]] = []

        def walk(node: Node, depth: int) -> None:
            for child in node.children:
                out.append((child, depth + 1))
                walk(child, depth + 1)

        walk(self.root, 0)
        return out

    def tip(self) -> Node:
        """Where the next level's vertices hang: the first deepest vertex, else the root."""
        nodes = self.nodes()
        if not nodes:
            return self.root
        deepest = max(d for _, d in nodes)
        return next(n for n, d in nodes if d == deepest)

    def found_titles(self) -> list[str]:
        """Gold titles retrieved anywhere in the tree (for ``episode.meta['found_titles']``)."""
        gold = {normalize_title(t) for t in self.gold_titles}
        return sorted({normalize_title(n.doc.title) for n, _ in self.nodes() if n.doc and n.hits(gold)})

    def key(self) -> tuple[Any, ...]:
        return (self.question_id, self.root.key())


Forest = list[RetrievalTree]


def documents(tree: RetrievalTree) -> list[RetrievedDoc]:
    """``d~``: the tree's documents in depth-first order, each once (the prompt's context)."""
    seen: set[str] = set()
    out: list[RetrievedDoc] = []
    for node, _ in tree.nodes():
        if node.doc is not None and node.doc.id not in seen:
            seen.add(node.doc.id)
            out.append(node.doc)
    return out


def expand(tree: RetrievalTree, step: Step) -> RetrievalTree:
    """``RRT_{u_i}^{j+1}``: a copy of ``tree`` with one vertex per sub-query of a search ``step``
    (its top-1 document) under the tip; any other step (stop, format error) adds nothing."""
    grown = copy.deepcopy(tree)
    if step.action != "search":
        return grown
    tip = grown.tip()
    kinds = step.query_kinds or ["base"] * len(step.queries)
    for query, kind, ranked in zip(step.queries, kinds, step.docs, strict=True):
        tip.children.append(Node(query, kind, ranked[0] if ranked else None))
    return grown


def finished(tree: RetrievalTree, step: Step) -> bool:
    """Algorithm 1's exit: every gold document is in the tree and the response stops."""
    return step.action == "stop" and len(tree.found_titles()) >= len(
        {normalize_title(t) for t in tree.gold_titles}
    )


def prune(tree: RetrievalTree, gold_titles: Sequence[str] | None = None) -> RetrievalTree:
    """A copy keeping only the branches that hit gold: a child survives iff its top-1 document is
    gold (its subtree goes with it otherwise). ``gold_titles`` defaults to the tree's own."""
    gold = {normalize_title(t) for t in (tree.gold_titles if gold_titles is None else gold_titles)}

    def keep(node: Node) -> Node:
        return Node(node.query, node.kind, node.doc, [keep(c) for c in node.children if c.hits(gold)])

    return RetrievalTree(tree.question, list(tree.gold_titles), keep(tree.root), tree.question_id)


def grow_forest(forest: Forest, level: Sequence[Sequence[Step]]) -> tuple[Forest, int]:
    """One batch's share of ``RR-Forest^{j+1}`` and how many of its responses finished their tree.

    ``level[i]`` holds the ``G`` responses to ``forest[i]``. Each response's tree (:func:`expand`)
    leaves the forest if :func:`finished`, else is pruned and kept, identical trees once. The input
    forest is not modified.
    """
    if len(level) != len(forest):
        raise ValueError(f"{len(level)} response lists for {len(forest)} trees")
    grown: Forest = []
    done = 0
    for tree, responses in zip(forest, level, strict=True):
        for step in responses:
            child = expand(tree, step)
            if finished(child, step):
                done += 1
                continue
            grown.append(prune(child))
    return survivors(grown), done


def survivors(forest: Forest, width: int | None = None) -> Forest:
    """The forest as a set (identical trees of a question once, first kept); with ``width``, at
    most that many trees per question, the ones holding the most gold first (ties in forest order)."""
    seen: set[tuple[Any, ...]] = set()
    unique: Forest = []
    for tree in forest:
        if tree.key() not in seen:
            seen.add(tree.key())
            unique.append(tree)
    if width is None:
        return unique
    ranked = sorted(range(len(unique)), key=lambda i: -len(unique[i].found_titles()))
    kept: dict[str, int] = {}
    keep = set()
    for i in ranked:
        qid = unique[i].question_id
        if kept.get(qid, 0) < width:
            kept[qid] = kept.get(qid, 0) + 1
            keep.add(i)
    return [t for i, t in enumerate(unique) if i in keep]


def context(tree: RetrievalTree) -> str:
    """The tree's branches as indented text, one line per vertex (logs and reports)."""
    lines = []
    for node, depth in tree.nodes():
        doc = f"{node.doc.title}: {node.doc.text}" if node.doc else "(nothing retrieved)"
        lines.append(f"{'  ' * (depth - 1)}- [{node.kind}] {node.query} -> {doc}")
    return "\n".join(lines)


def node_to_dict(node: Node) -> dict[str, Any]:
    return {
        "query": node.query,
        "kind": node.kind,
        "doc": node.doc.model_dump() if node.doc else None,
        "children": [node_to_dict(c) for c in node.children],
    }


def node_from_dict(data: dict[str, Any]) -> Node:
    doc = RetrievedDoc.model_validate(data["doc"]) if data["doc"] else None
    return Node(data["query"], data["kind"], doc, [node_from_dict(c) for c in data["children"]])


def tree_to_dict(tree: RetrievalTree) -> dict[str, Any]:
    return {"question": tree.question, "question_id": tree.question_id, "gold_titles": tree.gold_titles,
            "root": node_to_dict(tree.root)}  # fmt: skip


def tree_from_dict(data: dict[str, Any]) -> RetrievalTree:
    return RetrievalTree(data["question"], list(data["gold_titles"]), node_from_dict(data["root"]),
                         data.get("question_id", ""))  # fmt: skip
