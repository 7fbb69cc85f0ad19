"""R2AG's Reasoning-Augmented Retrieval Forest: retrieval trees grown one level per round.

A :class:`RetrievalTree` starts at its question (the root). Each round, every open leaf of every
tree is expanded by ``G`` sampled expansions (:mod:`hoprl.training.r2ag_rounds`), and
:func:`grow_forest` turns them into the next forest:

- **every sample's tree propagates**: sample ``s`` of a tree (the ``s``-th expansion at each of
  its open leaves: one sampled next level) makes a new tree, so a tree begets up to ``G`` trees,
  not only the best sample's;
- **pruning keeps only the branches that hit gold** (:func:`prune`): a branch whose top-1 document
  is not gold is cut with everything under it, so a non-hit child of a hit node is never expanded;
- an expanded node is closed: a node whose branches were all pruned is not retried, and a stop
  closes the leaf where it was emitted.

Identical trees (same queries, kinds and documents) are kept once: their prompts would be the same.
``forest_width`` (an option; the paper keeps every tree) caps the growing trees per question.
The survivors are the next round's context (:func:`context`), up to ``L_MAX`` levels.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hoprl.agent.trajectory import RetrievedDoc, Step
from hoprl.recipes.r2ag.config import L_MAX
from hoprl.recipes.rewards import normalize_title
from hoprl.schemas import Question


@dataclass
class Node:
    """One sub-query, its kind ('base' / 'predicted'; 'question' for the root) and top-1 doc."""

    query: str
    kind: str
    doc: RetrievedDoc | None = None
    children: list[Node] = field(default_factory=list)
    closed: bool = False  # expanded already, or the policy stopped (or failed to parse) here

    def hits(self, gold: set[str]) -> bool:
        return self.doc is not None and normalize_title(self.doc.title) in gold

    def key(self) -> tuple[Any, ...]:
        """What makes two subtrees the same: queries, kinds, documents, closed flags, children."""
        return (self.query, self.kind, self.doc.id if self.doc else None, self.closed,
                tuple(c.key() for c in self.children))  # fmt: skip


@dataclass
class RetrievalTree:
    """A question's retrieval tree; the root is the question, each level one expansion."""

    question: str
    gold_titles: list[str]
    root: Node
    question_id: str = ""

    @classmethod
    def for_question(cls, question: Question) -> RetrievalTree:
        root = Node(question.question, "question")
        return cls(question.question, list(question.gold_titles), root, question.id)

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
        found: set[str] = set()

        def walk(node: Node) -> None:
            if node.doc is not None and node.hits(gold):
                found.add(normalize_title(node.doc.title))
            for child in node.children:
                walk(child)

        walk(self.root)
        return sorted(found)


Forest = list[RetrievalTree]


def expand(forest: Forest, level_outputs: Sequence[Sequence[Step]], l_max: int = L_MAX) -> int:
    """Add one level in place: ``level_outputs[i]`` holds one expansion per node of ``forest[i].frontier()``.

    Every expanded leaf is closed; a search expansion also adds one child per sub-query (with its
    top-1 document). Returns the number of nodes added.
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
            leaf.closed = True
            if step.action != "search":
                continue
            kinds = step.query_kinds or ["base"] * len(step.queries)
            for query, kind, ranked in zip(step.queries, kinds, step.docs, strict=True):
                leaf.children.append(Node(query, kind, ranked[0] if ranked else None))
                added += 1
    return added


def prune(tree: RetrievalTree, gold_titles: Sequence[str] | None = None) -> RetrievalTree:
    """A copy keeping only the branches that hit gold: a child survives iff its top-1 document is
    gold (its subtree goes with it otherwise). ``gold_titles`` defaults to the tree's own."""
    gold = {normalize_title(t) for t in (tree.gold_titles if gold_titles is None else gold_titles)}

    def keep(node: Node) -> Node:
        children = [keep(c) for c in node.children if c.hits(gold)]
        return Node(node.query, node.kind, node.doc, children, node.closed)

    return RetrievalTree(tree.question, list(tree.gold_titles), keep(tree.root), tree.question_id)


def grow_forest(forest: Forest, level: Sequence[Sequence[Sequence[Step]]], l_max: int = L_MAX) -> Forest:
    """The next forest: one pruned tree per tree and sample, identical trees kept once (module doc).

    ``level[i][j]`` holds the ``G`` sampled expansions of ``forest[i].frontier(l_max)[j]``; every
    leaf of a tree has the same ``G``. The input forest is not modified.
    """
    if len(level) != len(forest):
        raise ValueError(f"{len(level)} expansion lists for {len(forest)} trees")
    grown: Forest = []
    seen: set[tuple[Any, ...]] = set()
    for tree, groups in zip(forest, level, strict=True):
        sizes = {len(g) for g in groups}
        if len(sizes) > 1:
            raise ValueError(f"the leaves of {tree.question!r} have groups of sizes {sorted(sizes)}")
        for s in range(sizes.pop() if sizes else 0):
            sample = copy.deepcopy(tree)
            expand([sample], [[group[s] for group in groups]], l_max)
            pruned = prune(sample)
            key = (pruned.question_id, pruned.root.key())
            if key not in seen:
                seen.add(key)
                grown.append(pruned)
    return grown


def survivors(forest: Forest, l_max: int = L_MAX, width: int | None = None) -> Forest:
    """The trees that can still grow; with ``width``, at most that many per question, the ones
    holding the most gold first (ties in forest order)."""
    growing = [t for t in forest if t.frontier(l_max)]
    if width is None:
        return growing
    ranked = sorted(range(len(growing)), key=lambda i: -len(growing[i].found_titles()))
    kept: dict[str, int] = {}
    keep = set()
    for i in ranked:
        qid = growing[i].question_id
        if kept.get(qid, 0) < width:
            kept[qid] = kept.get(qid, 0) + 1
            keep.add(i)
    return [t for i, t in enumerate(growing) if i in keep]


def context(tree: RetrievalTree) -> str:
    """The tree's branches as indented text, one line per node, for the next round's prompt."""
    lines: list[str] = []

    def walk(node: Node, depth: int) -> None:
        doc = f"{node.doc.title}: {node.doc.text}" if node.doc else "(nothing retrieved)"
        lines.append(f"{'  ' * depth}- [{node.kind}] {node.query} -> {doc}")
        for child in node.children:
            walk(child, depth + 1)

    for child in tree.root.children:
        walk(child, 0)
    return "\n".join(lines)


def node_to_dict(node: Node) -> dict[str, Any]:
    return {
        "query": node.query,
        "kind": node.kind,
        "closed": node.closed,
        "doc": node.doc.model_dump() if node.doc else None,
        "children": [node_to_dict(c) for c in node.children],
    }


def node_from_dict(data: dict[str, Any]) -> Node:
    doc = RetrievedDoc.model_validate(data["doc"]) if data["doc"] else None
    children = [node_from_dict(c) for c in data["children"]]
    return Node(data["query"], data["kind"], doc, children, data["closed"])


def tree_to_dict(tree: RetrievalTree) -> dict[str, Any]:
    return {"question": tree.question, "question_id": tree.question_id, "gold_titles": tree.gold_titles,
            "root": node_to_dict(tree.root)}  # fmt: skip


def tree_from_dict(data: dict[str, Any]) -> RetrievalTree:
    return RetrievalTree(data["question"], list(data["gold_titles"]), node_from_dict(data["root"]),
                         data.get("question_id", ""))  # fmt: skip
