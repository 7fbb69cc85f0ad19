"""The judge interface recipes call, and the rule-based judge that needs no model.

A judge answers two questions:

* :meth:`Judge.answer` — does a prediction mean the same as the reference answers?
* :meth:`Judge.answerable` — can the question be answered from this evidence? (EVO-RAG's
  refusal reward asks this.)

Both return a :class:`Verdict` that records which backend and version decided, so every score
stored with a run can be traced to the rules that produced it. The judge *service* will offer
LLM backends behind the same interface; :class:`RulesJudge` is the embedded default and the
fallback when an LLM call fails.

>>> RulesJudge().answer("The Eiffel Tower.", ["Eiffel Tower"]).verdict
True

**Where the judge differs from the official metrics.** EM, F1 and containment in
:mod:`hoprl.metrics.answer` stay the official SQuAD/HotpotQA definitions (no accent folding), so
reported EM/F1 compare with published numbers. The judge decides *equivalence*, so its rules
(``rules@3``) add three things on top: accents are folded on both sides (:func:`fold`: "Pedro
Rodríguez" is "Pedro Rodriguez"); a reference that occurs in the prediction only under a
negation ("not Paris", "it was never Paris", "neither Paris nor Lyon") does not count
(:func:`contains_unnegated`), while "Paris, France" and "Lyon? No, Paris" still do; and a
prediction that normalises to nothing ("the", "!!!", a NUL) never matches, not even a reference
that normalises to nothing too. The official EM compares the normalised strings, so it scores
``exact_match("the", ["a"])`` 1.0; the judge decides whether an answer was *given*, and an empty
one was not (a reward built on the judge cannot be earned by saying nothing).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Protocol

from pydantic import BaseModel, Field

from hoprl.metrics.answer import containment, exact_match, f1, normalize_answer

RULES_VERSION = "rules@3"

# Words that carry no content in a question: interrogatives, auxiliaries, prepositions and the
# like. Overlap on them would make any English evidence look relevant.
_STOPWORD_TEXT = """
    a an the and or but of in on at to for from by with as into about than then that this these
    those there here is are was were be been being do does did has have had will would can could
    should may might must shall what which who whom whose when where why how whether if it its
    he she they them his her their we you i me my our your not no yes also both either neither
    one first last same more most less many much
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())

# Letters that Unicode does not decompose into a base letter plus a mark, so NFKD alone would
# keep them ("Søren" would stay apart from "Soren"); typographic apostrophes become ASCII ones so
# "isn’t" normalises like "isn't". (unidecode would cover more scripts but is GPL; anyascii
# transliterates non-Latin scripts, which an answer judge must not do.)
_UNDECOMPOSED = str.maketrans({"ø": "o", "ł": "l", "đ": "d", "ħ": "h", "ı": "i", "æ": "ae",
                               "œ": "oe", "þ": "th", "ð": "d", "’": "'", "‘": "'"})  # fmt: skip

# Negation cues after normalisation (punctuation is gone, so "isn't" is "isnt").
_NEGATIONS = frozenset(
    """not no never neither nor none nobody nothing nowhere cannot without isnt arent wasnt werent
    dont doesnt didnt cant couldnt wont wouldnt shouldnt hasnt havent hadnt aint mustnt neednt""".split()
)
# Words that end the reach of a negation: "not Lyon but Paris" affirms Paris.
_CONTRAST = frozenset("but however although though whereas instead rather".split())
# Clause punctuation: a run of these followed by a space or the end ("Lyon, Paris"), or an
# opening bracket after a space. "St. Louis" splits too (harmless: a match may cross clauses),
# while "1,000" and "3.5" do not, so the tokens are those of the official normalisation.
_CLAUSE_BREAK = re.compile(r"[,;:.!?)\]}\u2013\u2014]+(?=\s|$)|(?:^|(?<=\s))[(\[{\u2013\u2014]+")


def fold(text: str) -> str:
    """Accent-folded, case-folded ``text``: NFKD, combining marks dropped, then casefold; control
    and format characters (NUL, zero-width space, ...: Unicode category C) become spaces, so a
    string of them folds to blanks and normalises to nothing.

    >>> fold("Pedro Rodríguez"), fold("Søren Kierkegaard"), fold("Straße"), fold("a\\x00b")
    ('pedro rodriguez', 'soren kierkegaard', 'strasse', 'a b')
    """
    decomposed = unicodedata.normalize("NFKD", text)
    kept = (" " if unicodedata.category(ch)[0] == "C" else ch for ch in decomposed)
    return "".join(ch for ch in kept if not unicodedata.combining(ch)).casefold().translate(_UNDECOMPOSED)


def _clause_tokens(text: str) -> list[tuple[str, int]]:
    """Normalised tokens of ``text`` with the index of the clause each belongs to."""
    out: list[tuple[str, int]] = []
    clause = 0
    for segment in _CLAUSE_BREAK.split(text):
        for token in normalize_answer(segment).split():
            if token in _CONTRAST:
                clause += 1
            out.append((token, clause))
        clause += 1
    return out


def _negated(tokens: list[tuple[str, int]], start: int) -> bool:
    """Whether a negation cue precedes position ``start`` within its clause ("not only" is none)."""
    clause = tokens[start][1]
    j = start - 1
    while j >= 0 and tokens[j][1] == clause:
        word = tokens[j][0]
        if word in _NEGATIONS and not (word == "not" and tokens[j + 1][0] == "only"):
            return True
        j -= 1
    return False


def contains_unnegated(prediction: str, references: list[str]) -> bool:
    """A reference occurs in ``prediction`` as whole normalised words, at least once *not* after a
    negation cue of its clause. Both sides should already be :func:`fold` ed.

    Only cues *before* the reference count: "Paris and not Lyon" must affirm Paris, so a trailing
    negation ("Paris is not it") is not read; such answers are rare, and an LLM judge reads them.

    >>> contains_unnegated("paris, france", ["paris"]), contains_unnegated("not paris", ["paris"])
    (True, False)
    >>> contains_unnegated("it is not lyon but paris", ["paris"])
    True
    """
    tokens = _clause_tokens(prediction)
    words = [t for t, _ in tokens]
    for reference in references:
        gold = normalize_answer(reference).split()
        n = len(gold)
        for start in range(len(words) - n + 1) if n else ():
            if words[start : start + n] == gold and not _negated(tokens, start):
                return True
    return False


def has_negation(text: str) -> bool:
    """Whether ``text`` holds a negation cue (after normalisation)."""
    return any(t in _NEGATIONS for t in normalize_answer(text).split())


class Verdict(BaseModel):
    """A judge's decision with its evidence trail."""

    verdict: bool
    score: float = Field(description="graded support for the verdict in [0, 1]")
    rationale: str = Field(description="which rule or reasoning decided, in one sentence")
    backend: str = Field(description="'rules', 'openai', ...")
    version: str = Field(description="versioned name of the rules or prompt, e.g. 'rules@1'")


class Judge(Protocol):
    """What recipes and reward functions depend on; any backend implements these two calls."""

    def answer(self, prediction: str, references: list[str], question: str = "") -> Verdict:
        """Is ``prediction`` semantically the same answer as any of ``references``?"""
        ...

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        """Is ``question`` answerable from ``evidence`` alone?"""
        ...


def content_words(text: str) -> list[str]:
    """Folded, normalised tokens of ``text`` minus stopwords, de-duplicated in order of appearance."""
    tokens = normalize_answer(fold(text)).split()
    return list(dict.fromkeys(t for t in tokens if t not in _STOPWORDS))


class RulesJudge:
    """Rule-based judge: exact match, containment and token F1 on folded text (``rules@3``).

    Every rule sees both sides through :func:`fold` (accents and case folded) and then the
    official normalisation; see the module docstring for how that differs from EM/F1.

    Args:
        f1_threshold: token F1 at or above which a prediction counts as the same answer.
        use_containment: accept a prediction that contains a reference as whole words
            ("He was born in Paris" for "Paris") unless a negation governs it ("not Paris").
            Lenient with lists of guesses; turn it off to grade terse answers strictly.
        min_question_overlap: without references, the share of the question's content words
            that must occur in the evidence for the question to count as answerable.
    """

    backend = "rules"
    version = RULES_VERSION

    def __init__(
        self,
        f1_threshold: float = 0.8,
        use_containment: bool = True,
        min_question_overlap: float = 0.5,
    ) -> None:
        self.f1_threshold = f1_threshold
        self.use_containment = use_containment
        self.min_question_overlap = min_question_overlap

    def _verdict(self, verdict: bool, score: float, rationale: str) -> Verdict:
        return Verdict(
            verdict=verdict, score=score, rationale=rationale, backend=self.backend, version=self.version
        )

    def answer(self, prediction: str, references: list[str], question: str = "") -> Verdict:
        """Exact match, else containment, else F1 >= ``f1_threshold``; ``score`` is the best F1.

        All on :func:`fold` ed text. Containment counts only an occurrence that no negation cue
        of its clause precedes ("not Paris" is not "Paris"), and a prediction with a negation cue
        that no reference has never passes on F1 alone ("not Pedro Rodriguez" has F1 0.8
        against "Pedro Rodriguez"). ``question`` is accepted for interface parity with LLM
        judges and unused by the rules.
        """
        if not references:
            return self._verdict(False, 0.0, "no reference answer: the question is unanswerable")
        pred, refs = fold(prediction), [fold(r) for r in references]
        if not normalize_answer(pred):
            return self._verdict(False, 0.0, "the prediction is empty after normalisation: no answer")
        refs = [r for r in refs if normalize_answer(r)]
        if not refs:
            return self._verdict(False, 0.0, "every reference is empty after normalisation: nothing to match")
        if exact_match(pred, refs):
            return self._verdict(True, 1.0, "normalised exact match with a reference")
        score = f1(pred, refs)
        if self.use_containment and contains_unnegated(pred, refs):
            return self._verdict(True, score, "a reference occurs in the prediction")
        if has_negation(pred) and not any(has_negation(r) for r in refs):
            negated = "a reference occurs only after a negation cue of its clause"
            extra = "the prediction holds a negation cue that no reference has"
            return self._verdict(False, score, negated if containment(pred, refs) else extra)
        if score >= self.f1_threshold:
            return self._verdict(True, score, f"token F1 {score:.2f} >= {self.f1_threshold}")
        return self._verdict(False, score, f"token F1 {score:.2f} < {self.f1_threshold}, no match")

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        """Decide answerability from the evidence.

        Evidence, question and references are :func:`fold` ed first. With ``references`` (gold
        answer + aliases, all naming the same answer): answerable iff one of them occurs,
        normalised and as whole words, in the concatenated evidence (a negation does not matter
        here: "born in Paris, not Lyon" holds the fact about Lyon as well). An empty list means
        the question has no answer, so it is not answerable.

        Without references (a heuristic for serving, where gold is unknown): answerable iff
        the evidence is non-empty and contains at least ``min_question_overlap`` of the
        question's content words (normalised tokens that are not stopwords); ``score`` is that
        share. A question with no content words is answerable iff there is any evidence.
        """
        joined = fold(" ".join(evidence))
        if references is not None:
            if not references:
                return self._verdict(False, 0.0, "no reference answer exists for this question")
            found = containment(joined, [fold(r) for r in references])
            why = "a reference answer occurs in the evidence" if found else "no reference in evidence"
            return self._verdict(bool(found), found, why)
        if not normalize_answer(joined):
            return self._verdict(False, 0.0, "no evidence")
        wanted = content_words(question)
        if not wanted:
            return self._verdict(True, 1.0, "question has no content words; evidence is present")
        present = set(normalize_answer(joined).split())
        share = sum(w in present for w in wanted) / len(wanted)
        ok = share >= self.min_question_overlap
        sign = ">=" if ok else "<"
        why = f"{share:.2f} of the question's content words in evidence {sign} {self.min_question_overlap}"
        return self._verdict(ok, share, why)


class JudgeLedger:
    """A judge that counts who decided: wraps any :class:`Judge` and tallies each verdict's backend.

    ``expected`` is the backend the paper's reward or metric calls for (``"openai"``: an LLM judge;
    ``"rules"``); ``bound`` says whether ``judge`` is the judge service (not the embedded rules). A
    verdict from another backend, or one marked ``fallback`` (the judge service's LLM or the
    service itself was unreachable), counts as a fallback, so a job whose reward ran on the rules
    where the paper used an LLM says so in its metrics (:meth:`metrics`, :func:`judge_flag`).

    >>> ledger = JudgeLedger(RulesJudge(), expected="openai")
    >>> ledger.answer("Paris", ["Paris"]).verdict, ledger.metrics()["judge/fallbacks"]
    (True, 1.0)
    """

    def __init__(self, judge: Judge, expected: str = "rules", bound: bool = False) -> None:
        self.judge, self.expected, self.bound = judge, expected, bound
        self.calls = self.fallbacks = 0
        self.by_backend: dict[str, int] = {}

    def answer(self, prediction: str, references: list[str], question: str = "") -> Verdict:
        return self._count(self.judge.answer(prediction, references, question))

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        return self._count(self.judge.answerable(question, evidence, references))

    def _count(self, verdict: Verdict) -> Verdict:
        self.calls += 1
        self.by_backend[verdict.backend] = self.by_backend.get(verdict.backend, 0) + 1
        if verdict.backend != self.expected or getattr(verdict, "fallback", False):
            self.fallbacks += 1
        return verdict

    def metrics(self) -> dict[str, float]:
        """``judge/llm_expected`` (1 when the paper's judge is an LLM), ``judge/service_bound``,
        ``judge/calls``, ``judge/llm_calls`` (verdicts an LLM gave) and ``judge/fallbacks``."""
        return {
            "judge/llm_expected": float(self.expected != "rules"),
            "judge/service_bound": float(self.bound),
            "judge/calls": float(self.calls),
            "judge/llm_calls": float(self.by_backend.get("openai", 0)),
            "judge/fallbacks": float(self.fallbacks),
        }


def judge_flag(metrics: dict[str, float], prefix: str = "") -> str | None:
    """A warning when the paper's LLM judge was not the one that decided, else ``None``.

    Reads :meth:`JudgeLedger.metrics` as a job logs them (``prefix`` ``"train/"`` on a pipeline run).

    >>> judge_flag({"judge/llm_expected": 1.0, "judge/calls": 4.0, "judge/fallbacks": 4.0})
    'the paper judges with an LLM, but 4 of 4 verdicts came from the rules judge (fallback)'
    """
    expected = metrics.get(f"{prefix}judge/llm_expected", 0.0)
    calls, fallbacks = metrics.get(f"{prefix}judge/calls", 0.0), metrics.get(f"{prefix}judge/fallbacks", 0.0)
    if expected and not metrics.get(f"{prefix}judge/service_bound", 1.0):
        return "the paper judges with an LLM, but no judge service was bound: the rules judge decides"
    if not expected or not fallbacks:
        return None
    return (
        f"the paper judges with an LLM, but {fallbacks:.0f} of {calls:.0f} verdicts came from the "
        "rules judge (fallback)"
    )
