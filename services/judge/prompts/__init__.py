"""Versioned judge prompts: ``<name>@<version>.txt`` files shipped as package data.

A prompt file is a ``str.format`` template; answer prompts take ``{question}``,
``{references}`` and ``{prediction}``, the answerability prompt ``{question}``, ``{references}``
and ``{evidence}``. Its file name is the version recorded with every verdict it produces, so a
changed prompt gets a new file (``answer_equivalence@2.txt``), never an edit in place.

>>> load_prompt("answer_equivalence@1").positive
('yes',)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files


@dataclass(frozen=True)
class Prompt:
    """A template and the reply words that mean a positive or a negative verdict (lower case)."""

    version: str
    template: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]


# version -> (positive words, negative words) the prompt asks the model to reply with
ANSWER_PROMPTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "answer_equivalence@1": (("yes",), ("no",)),
    "answer_validation@1": (("correct",), ("wrong", "incorrect")),
    # ARENA's LLM-as-a-Judge prompt (App. C.3, Table 8), for its LJ metric with GPT-4o at temperature 0
    "arena_lj@1": (("yes",), ("no",)),
    # Learning When to Search's judge instruction (App. B.4), with Qwen3-235B-A22B-Instruct
    "when_to_search_judge@1": (("yes",), ("no",)),
}
ANSWERABLE_PROMPTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "answerable@1": (("yes",), ("no",)),
}


@cache
def load_prompt(version: str) -> Prompt:
    """The prompt ``version`` (e.g. ``"answerable@1"``), read from the installed package."""
    known = ANSWER_PROMPTS | ANSWERABLE_PROMPTS
    if version not in known:
        raise ValueError(f"unknown judge prompt {version!r}; known: {sorted(known)}")
    template = files(__name__).joinpath(f"{version}.txt").read_text(encoding="utf-8")
    positive, negative = known[version]
    return Prompt(version=version, template=template, positive=positive, negative=negative)


def bullet_list(values: list[str] | None, empty: str) -> str:
    """One ``- value`` line per value, or ``empty`` when there are none."""
    return "\n".join(f"- {v}" for v in values) if values else empty


def render_answer(prompt: Prompt, question: str, prediction: str, references: list[str]) -> str:
    return prompt.template.format(
        question=question or "(not given)",
        prediction=prediction or "(empty)",
        references=bullet_list(references, "(none)"),
    )


def render_answerable(
    prompt: Prompt, question: str, evidence: list[str], references: list[str] | None
) -> str:
    passages = "\n\n".join(f"[{i}] {p}" for i, p in enumerate(evidence, start=1)) or "(no passages)"
    known = "(none known)" if references is None else bullet_list(references, "(the question has no answer)")
    return prompt.template.format(question=question, evidence=passages, references=known)
