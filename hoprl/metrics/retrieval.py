"""Retrieval metrics of a ranked list against a question's gold paragraphs."""

from __future__ import annotations

from collections.abc import Sequence


def recall_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    """Share of the gold ids found in the top ``k``."""
    if not gold:
        return 0.0
    return len(gold.intersection(ranked[:k])) / len(gold)


def full_recall_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    """1.0 if every gold id is in the top ``k`` (all hops retrieved), else 0.0."""
    return float(bool(gold) and gold.issubset(ranked[:k]))


def average_precision(ranked: Sequence[str], gold: set[str], k: int | None = None) -> float:
    """AP over the (cut-off) ranking: mean of precision@i at each gold hit, divided by |gold|."""
    if not gold:
        return 0.0
    hits, total = 0, 0.0
    for i, doc in enumerate(ranked[:k] if k else ranked, start=1):
        if doc in gold:
            hits += 1
            total += hits / i
    return total / len(gold)


def retrieval_report(
    rankings: Sequence[Sequence[str]], golds: Sequence[set[str]], ks: Sequence[int]
) -> dict[str, float]:
    """Mean Recall@K, Full-Recall@K for each K, and mAP@max(K), over questions with gold."""
    pairs = [(r, g) for r, g in zip(rankings, golds, strict=True) if g]
    if not pairs:
        raise ValueError("no question has gold paragraphs; retrieval metrics need them")
    n = len(pairs)
    out: dict[str, float] = {}
    for k in ks:
        out[f"recall@{k}"] = sum(recall_at_k(r, g, k) for r, g in pairs) / n
        out[f"full_recall@{k}"] = sum(full_recall_at_k(r, g, k) for r, g in pairs) / n
    out[f"map@{max(ks)}"] = sum(average_precision(r, g, max(ks)) for r, g in pairs) / n
    out["questions"] = n
    return out


def agent_retrieval(retrieved: Sequence[Sequence[str]], golds: Sequence[set[str]]) -> dict[str, float]:
    """The retrieval of the agent itself, as R2AG reports it (Recall, Full-Recall and mAP at K).

    ``retrieved[i]``: the paragraph ids question ``i``'s episode got back, in the order they came
    (step by step, each query's results in rank order); repeats count once, at their first place.
    Each question is scored at its own K (the distinct paragraphs it retrieved): Recall@K,
    Full-Recall@K and AP over that list. Returns the means over the questions with gold as
    ``agent_recall``, ``agent_full_recall``, ``agent_map``, and the mean K as ``agent_k`` (the
    paper reports K beside the metrics: more documents buy recall); empty without gold.

    >>> r = agent_retrieval([["a", "x", "a", "b"], []], [{"a", "b"}, {"c"}])
    >>> r["agent_k"], r["agent_recall"], r["agent_full_recall"], round(r["agent_map"], 4)
    (1.5, 0.5, 0.5, 0.4167)
    """
    pairs = [(list(dict.fromkeys(r)), g) for r, g in zip(retrieved, golds, strict=True) if g]
    if not pairs:
        return {}
    n = len(pairs)
    return {
        "agent_recall": sum(recall_at_k(r, g, len(r)) for r, g in pairs) / n,
        "agent_full_recall": sum(full_recall_at_k(r, g, len(r)) for r, g in pairs) / n,
        "agent_map": sum(average_precision(r, g) for r, g in pairs) / n,
        "agent_k": sum(len(r) for r, _ in pairs) / n,
    }
