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
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from hoprl.metrics.answer import containment, exact_match, f1, normalize_answer

RULES_VERSION = "rules@1"

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
    """Normalised tokens of ``text`` minus stopwords, de-duplicated in order of appearance."""
    tokens = normalize_answer(text).split()
    return list(dict.fromkeys(t for t in tokens if t not in _STOPWORDS))


class RulesJudge:
    """Rule-based judge: normalised exact match, containment and token F1 (``rules@1``).

    Args:
        f1_threshold: token F1 at or above which a prediction counts as the same answer.
        use_containment: accept a prediction that contains a reference as whole words
            ("He was born in Paris" for "Paris"). Lenient with lists of guesses; turn it off
            to grade terse answers strictly.
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

        ``question`` is accepted for interface parity with LLM judges and unused by the rules.
        """
        if not references:
            return self._verdict(False, 0.0, "no reference answer: the question is unanswerable")
        if exact_match(prediction, references):
            return self._verdict(True, 1.0, "normalised exact match with a reference")
        score = f1(prediction, references)
        if self.use_containment and containment(prediction, references):
            return self._verdict(True, score, "a reference occurs in the prediction")
        if score >= self.f1_threshold:
            return self._verdict(True, score, f"token F1 {score:.2f} >= {self.f1_threshold}")
        return self._verdict(False, score, f"token F1 {score:.2f} < {self.f1_threshold}, no match")

    def answerable(self, question: str, evidence: list[str], references: list[str] | None = None) -> Verdict:
        """Decide answerability from the evidence.

        With ``references`` (gold answer + aliases, all naming the same answer): answerable iff
        one of them occurs, normalised and as whole words, in the concatenated evidence. An
        empty list means the question has no answer, so it is not answerable.

        Without references (a heuristic for serving, where gold is unknown): answerable iff
        the evidence is non-empty and contains at least ``min_question_overlap`` of the
        question's content words (normalised tokens that are not stopwords); ``score`` is that
        share. A question with no content words is answerable iff there is any evidence.
        """
        joined = " ".join(evidence)
        if references is not None:
            if not references:
                return self._verdict(False, 0.0, "no reference answer exists for this question")
            found = containment(joined, references)
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
