"""Eval-RAR: Search-R1's protocol plus an ``<evaluate>`` block after every information turn.

The policy writes ``<think>``, ``<search>q</search>``, reads the injected top-3 ``<information>``,
then judges it inside ``<evaluate>...</evaluate>`` before thinking again, searching again or
answering in ``<answer>``.

Reward (outcome, per completion)::

    R_ans  = EM(final answer, gold answers)                     in {0, 1}
    R_eval = r_eval  if a gold answer (any alias) is contained, normalised and on word boundaries,
                     in the concatenated <evaluate> blocks, else 0
    R      = R_ans if R_ans > 0 else R_eval

so a wrong final answer still earns a small reward (r_eval = 0.1) when the policy recognised the
answer while evaluating evidence.

The evaluation is not optional: Algorithm 1 (lines 17-18) writes ``<evaluate>e</evaluate>`` after
every information block, so a segment right after an ``<information>`` turn that does not open with
a closed, non-empty ``<evaluate>`` block before its action is an invalid action
(:meth:`EvalRAR.parse_after_information`, the runner's hook); the grammar of constrained decoding
(:mod:`hoprl.agent.grammar`) asks for the same block. The system prompt is App. A.1's, with its
instructions for what the evaluation holds (the supporting source content, or which information
is missing).

An invalid action (no ``<search>`` or ``<answer>`` block, nested tags, no evaluation after
information) does not end the episode:
Algorithm 1 (line 22) appends "My action is wrong. Let me try again." (:data:`RETRY_MESSAGE`,
injected with mask 0) and the policy tries again, within the step cap N.
``retry_text="search-r1"`` injects Search-R1's longer message (:data:`SEARCH_R1_RETRY_MESSAGE`,
the project's earlier choice); ``retry_invalid=False`` ends the episode at the first invalid
action instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from hoprl.domain import Action, Episode
from hoprl.metrics.answer import containment
from hoprl.recipes.base import RewardFunc, alias, versioned
from hoprl.recipes.baselines import (
    SearchR1,
    SearchR1Config,
    exact_match_reward,
    generated_texts,
    gold_answers,
)
from hoprl.recipes.parsing import parse_tags

#: App. A.1's instruction, as the paper prints it; the question follows in the user turn
#: ("Question: ..."), where A.1 ends with ``Question: {question}``
EVAL_RAR_PROMPT = (
    "You are a helpful assistant excel at answering questions with multi-turn search engine calling. "
    "To answer questions, you must first reason through the available information using <think> and "
    "</think>. If you identify missing knowledge, you may issue a search request using <search> query "
    "</search> at any time. The retrieval system will provide you with the three most relevant "
    "documents enclosed in <information> and </information>. After each search, you must conduct an "
    "evaluation, reviewing the question and the retrieved documents comprehensively to determine if "
    "the question can be answered. If the question can be answered, clearly cite the source content "
    "from the search documents that supports your answer. If the question cannot be answered, specify "
    "what information is missing: entity information, relational information, or specific "
    "time/location details. Provide your evaluation using <evaluate> and </evaluate>. You may send "
    "multiple search requests if needed. Once you have sufficient information, provide a concise "
    "final answer using <answer> and </answer>. For example, <answer> Donald Trump </answer>."
)


#: Eval-RAR's Algorithm 1, line 22: what the loop appends after an action that is neither a
#: search nor an answer
RETRY_MESSAGE = "My action is wrong. Let me try again."

#: Search-R1's invalid-action message (its rollout loop), the ``retry_text="search-r1"`` option
SEARCH_R1_RETRY_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> "
    "and </search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)


class EvalRARConfig(SearchR1Config):
    top_k: int = 3
    system_prompt: str = EVAL_RAR_PROMPT
    #: reward for a gold answer inside the <evaluate> blocks when the final answer is wrong
    r_eval: float = 0.1
    #: inject a retry message after an invalid action and go on (the paper's loop), or end the episode
    retry_invalid: bool = True
    #: which message: Algorithm 1's (line 22) or Search-R1's (the earlier choice)
    retry_text: Literal["algorithm1", "search-r1"] = "algorithm1"


def evaluate_text(text: str) -> str:
    """The ``<evaluate>`` blocks of a completion, concatenated with spaces."""
    return " ".join(parse_tags(text, ["evaluate", "information"]).contents("evaluate"))


#: R_ans: exact match of the final answer (1 or 0): the baselines' outcome reward, versioned apart
answer_reward = alias(exact_match_reward, "eval_rar_answer@1")


def make_evaluate_reward(r_eval: float = 0.1) -> RewardFunc:
    """R_eval as a reward function: ``r_eval`` if a gold answer is in the evaluate blocks, else 0."""

    @versioned("eval_rar_evaluate@1")
    def evaluate_reward(
        prompts: Sequence[Any],
        completions: Sequence[Any],
        answers: Sequence[list[str]] | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        texts = generated_texts(completions, episodes)
        golds = gold_answers(len(texts), answers, episodes)
        return [r_eval * containment(evaluate_text(t), g) for t, g in zip(texts, golds, strict=True)]

    return evaluate_reward


def make_eval_rar_reward(r_eval: float = 0.1) -> RewardFunc:
    """The total: R_ans if R_ans > 0 else R_eval."""
    evaluate_reward = make_evaluate_reward(r_eval)

    @versioned("eval_rar@1")
    def eval_rar_reward(
        prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        r_ans = answer_reward(prompts, completions, **kwargs)
        r_ev = evaluate_reward(prompts, completions, **kwargs)
        return [a if a is not None and a > 0 else e for a, e in zip(r_ans, r_ev, strict=True)]

    return eval_rar_reward


class EvalRAR(SearchR1):
    """Search-R1 plus ``<evaluate>``; top-3 documents; reward R_ans else R_eval."""

    name: ClassVar[str] = "eval-rar"
    review_tag: ClassVar[str] = "evaluate"
    tags: ClassVar[list[str]] = ["think", "search", "answer", "information", "evaluate"]
    config: EvalRARConfig

    def __init__(self, **config: Any) -> None:
        self.config = EvalRARConfig(**config)
        self.top_k = self.config.top_k
        message = RETRY_MESSAGE if self.config.retry_text == "algorithm1" else SEARCH_R1_RETRY_MESSAGE
        self.retry_message = message if self.config.retry_invalid else ""

    def parse_after_information(self, segment: str) -> Action:
        """A segment after an information turn: first a closed, non-empty ``<evaluate>`` block
        (Algorithm 1, lines 17-18), then the action as :meth:`parse` reads it."""
        parsed = parse_tags(segment, self.tags)
        first = next((b for b in parsed.blocks if b.tag in ("evaluate", "search", "answer")), None)
        if first is None or first.tag != "evaluate" or not (first.closed and first.content):
            return Action(
                "format_error", error="no <evaluate> block after <information> (Algorithm 1, line 17)"
            )
        return self.parse(segment)

    def reward_funcs(self) -> list[RewardFunc]:
        """One function, the paper's total (its components are module functions, for logging)."""
        return [make_eval_rar_reward(self.config.r_eval)]
