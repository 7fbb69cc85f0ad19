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
