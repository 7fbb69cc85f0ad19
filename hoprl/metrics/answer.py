"""Answer metrics: the official SQuAD/HotpotQA normalisation, exact match, token F1, containment.

Every metric takes one prediction and the list of gold answers (``answers[0]`` the gold answer,
the rest aliases) and returns the best score over them, as the official evaluation scripts do.
An empty answer list (an unanswerable question) scores 0.0: there is nothing to match.

>>> exact_match("The Cat!", ["cat"])
1.0
>>> round(f1("the black cat", ["a cat"]), 3)
0.667

Metrics are registered by versioned name (``"em@1"``); bump the version when a definition
changes so old and new scores are never compared by accident.

These are the official definitions, accents included: ``exact_match("Pedro Rodriguez",
["Pedro Rodríguez"])`` is 0.0, as in the HotpotQA and SQuAD scripts, so reported EM/F1 compare
with published numbers. The judge (:mod:`hoprl.judging`) folds accents and reads negations on
top of them, because it decides whether two answers *mean* the same.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# The HotpotQA script gives no partial credit when either side is one of these: "no" must not
# earn half an F1 point against "no answer here", and "yes" against "yes, it is" scores 0.
_SPECIAL = frozenset({"yes", "no", "noanswer"})

Metric = Callable[[str, list[str]], float]


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.

    The order matters and follows the official script: punctuation goes before articles, so
    "the-cat" becomes "thecat" (no article left) while "the cat" becomes "cat".
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1_single(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    same = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, answers: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer or alias, else 0.0."""
    pred = normalize_answer(prediction)
    return max((float(pred == normalize_answer(a)) for a in answers), default=0.0)


def f1(prediction: str, answers: list[str]) -> float:
    """Token-level F1 between normalised prediction and answer, max over answers and aliases.

    Tokens are whitespace-split after normalisation and counted as a multiset (a repeated word
    matches at most as often as it occurs in both). yes / no / noanswer only score on equality.
    """
    return max((_f1_single(prediction, a) for a in answers), default=0.0)


def containment(prediction: str, answers: list[str]) -> float:
    """1.0 if any normalised gold answer occurs in the normalised prediction as whole words.

    Matching is on word boundaries ("1990" is not contained in "19901"), because plain substring
    matching would credit a short numeric answer inside any longer number.
    """
    padded = f" {normalize_answer(prediction)} "
    for answer in answers:
        gold = normalize_answer(answer)
        if gold and f" {gold} " in padded:
            return 1.0
    return 0.0


METRICS: dict[str, Metric] = {
    "em@1": exact_match,
    "f1@1": f1,
    "contains@1": containment,
}


def get_metric(name: str) -> Metric:
    """Look up a metric by versioned name; an unknown name raises with the valid names listed."""
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; valid: {', '.join(sorted(METRICS))}")
    return METRICS[name]
