"""Scripted episodes for the reward tests: the steps written out as a policy would write them.

episode("eval-rar", [search(1, "Acme founder", INFO), answer(2, "<answer>Jane Roe</answer>")],
        "Jane Roe", answers=["Jane Roe"])
"""

from __future__ import annotations

from typing import Any

from hoprl.domain import Episode, Step

ACME = "Who founded Acme Records?"


def searched(t: int, text: str, query: str, information: str, **fields: Any) -> Step:
    """Step ``t``: the search ``text`` for ``query``, answered with ``information``."""
    return Step(t=t, action="search", text=text, queries=[query], information=information, **fields)


def search(t: int, query: str, information: str, before: str = "", sep: str = "\n") -> Step:
    """Step ``t`` searching ``query``: ``{before}<think>t</think>{sep}<search>{query}</search>``."""
    return searched(t, f"{before}<think>t</think>{sep}<search>{query}</search>", query, information)


def answer(t: int, text: str, value: str | None = None) -> Step:
    """Step ``t`` answering with ``text``; ``value`` is the parsed answer (None: left unset)."""
    return Step(t=t, action="answer", answer=value, text=text)


def episode(recipe: str, steps: list[Step], final: str | None, answers: list[str], question: str = ACME,
            question_id: str = "q", **fields: Any) -> Episode:  # fmt: skip
    """An episode of ``recipe`` on ``question`` ending with the answer ``final``."""
    return Episode(recipe=recipe, question_id=question_id, question=question, answers=answers, steps=steps,
                   final_answer=final, **fields)  # fmt: skip
