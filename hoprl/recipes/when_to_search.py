"""When-to-search: learn to search only when needed, with concise, diverse queries.

Protocol: ``<think>`` ... ``<search>keywords</search>``, the injected ``<information>``, then
``<reflect>`` on it, ... and finally ``<answer>``. The reward is ``r = r_a + r_s + r_f``:

- r_f (format): +1 if the generated text is well formed, else -1. Well formed: every block closed,
  none nested, nothing but whitespace outside the blocks, and the tag sequence (injected
  information left out) is one of the paper's two forms: ``think reflect answer`` (answered
  without searching) or ``think (search reflect think?)+ answer`` (every search is reflected on
  before the next search or the answer). ``format_rule="lenient"`` also accepts ``think answer``
  (this project's earlier reading, kept as an option).
- r_s (search, Eq. 9), with RC = N the number of searches: 0 if RC = 0; for RC = 1, 0 if the
  query is concise and -1 if not; for RC > 1, ``-avg_sim`` with Eq. 8 as printed,
  ``avg_sim = sum_{i<j} cos(m_i, m_j) / (N(N-1))`` (queries embedded with
  :func:`hoprl.embedding.get_embedder`). The printed denominator is twice the number of pairs, so
  N identical queries give avg_sim = 0.5; ``avg_sim="pairs"`` divides by the N(N-1)/2 pairs
  instead (the mean of pairwise cosines the sentence before Eq. 8 names; identical queries: 1).
- r_a (answer), b = 0.3: stage 1: 1 if correct else -1 + b*RC (searching is encouraged when
  wrong); stage 2: 1 - b*RC if correct else -1 (searching costs once the policy is right).
  Correct is decided as in the paper's protocol by a judge (``correct_metric="judge"``, the
  default): the recipe's ``judge`` (the trainer binds the judge service when
  ``TRAINER_JUDGE_URL`` is set), falling back to normalised exact match when no judge is bound.
  ``"em"`` and ``"containment"`` are options.

Paper defaults: top-k 5 documents per search and at most 5 turns (``max_turns``, the runner's
episode cap for this recipe).

"Concise" is not defined by the method; here a query is concise when it has at most
``concise_max_words`` words (6) and is not phrased as a question: it does not end with ``?`` and
does not start with a question word (``question_words``).

The SFT expert (``expert``): ``"hops"`` (the default) is the Search-R1 script, one search per
gold hop whatever the results hold, so a warm-started policy always searches once per hop.
``"adaptive"`` first searches the question's keywords (:func:`keyword_query`), reads what came
back and searches a hop's own query only for gold paragraphs still missing: it answers after one
search when that search found every hop, which gives the policy examples of *not* searching
again. ``"hops-adaptive"`` reads the results the same way but starts with the first hop's own query,
as ``"hops"`` does: it stops after that one search only when the results already list the second
hop's paragraph too, so most of its episodes search once per hop and the rest show the policy
when a second search is not needed. Both read the results through
:meth:`WhenToSearch.expert_reader` (the SFT path hands it each turn's conversation), not
:meth:`~hoprl.recipes.baselines.SearchR1.expert_segments`, which cannot see them.

The stage comes from :class:`Curriculum`, which the trainer updates between segments; the r_a
reward reads the recipe's curriculum at call time.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, model_validator

from hoprl.data.synthetic import hops_for
from hoprl.domain import Episode, Question
from hoprl.judging import Judge
from hoprl.metrics.answer import containment, exact_match
from hoprl.recipes.base import CurriculumState, RewardFunc, versioned
from hoprl.recipes.baselines import (
    SearchR1,
    SearchR1Config,
    expert_answer,
    expert_final,
    expert_search,
    final_answers,
    generated_texts,
    gold_answers,
    hop_fact,
    lists_title,
)
from hoprl.recipes.parsing import outside_text, parse_tags

TAGS = ["think", "search", "reflect", "answer", "information"]
#: r_f's accepted tag sequences (injected information left out), by ``format_rule``
SEQUENCES = {
    "paper": re.compile(r"think reflect answer|think( search reflect( think)?)+ answer"),
    "lenient": re.compile(r"think( reflect)? answer|think( search reflect( think)?)+ answer"),
}

QUESTION_WORDS = (
    "what",
    "who",
    "whom",
    "whose",
    "which",
    "when",
    "where",
    "why",
    "how",
    "is",
    "are",
    "was",
    "were",
    "do",
    "does",
    "did",
    "can",
    "could",
    "should",
    "would",
    "will",
)

#: words a keyword query leaves out besides the question words
FUNCTION_WORDS = ("the", "a", "an", "of", "that", "in", "on", "to", "for", "by", "with", "and", "or", "has")

#: App. B.4's "Instruction for Trained RLM", as the paper prints it; the question follows in the
#: user turn
WHEN_TO_SEARCH_PROMPT = (
    "Please answer the given question by following the structured reasoning protocol below:\n"
    "1. Always begin with <think>...</think> to provide a brief internal reasoning sketch. - This "
    "reasoning must primarily rely on your internal knowledge and reasoning abilities. - If your "
    "internal knowledge is sufficient to answer the question, do not assume the need for external "
    "tools.\n"
    "2. If your internal knowledge is sufficient to answer the question: - Provide a concise summary "
    "of your reasoning inside <reflect>...</reflect>. - Then give the final answer inside "
    "<answer>...</answer>. - Under no circumstances should you generate a <search> block if your "
    "internal knowledge is adequate.\n"
    "3. Only if your internal knowledge is genuinely insufficient to answer the question: - Generate "
    "a brief keyword-based search query inside <search>...</search>. The query should be as concise "
    "as possible but must include sufficient factual clues, such as names, dates, locations, key "
    "concepts, etc. - The query should be a brief description with multiple keywords instead of a "
    "natural language question.\n"
    "4. When the system returns information inside <information>...</information>: - If the "
    "information is reliable and sufficient, integrate it with your reasoning inside "
    "<reflect>...</reflect>. - Then provide the final concise answer inside <answer>...</answer>.\n"
    "5. If the retrieved information is insufficient or contradicts your internal knowledge: - "
    "Explain the issue within <reflect>...</reflect>. - If necessary, generate a revised <search> "
    "query.\n"
    "6. Final rule: - The final answer must be concise and clear, placed inside <answer></answer>. - "
    "Internal reasoning (in <think>) must always be the primary method; tool usage should be a last "
    "resort, not the default."
)

#: a compact instruction of the same protocol (think, search keywords, information, reflect, answer),
#: the recipe's prompt before App. B.4's was adopted: the cpu preset's (hoprl.jobspec.CPU_RECIPE_CONFIG),
#: where SmolLM2-135M's warm start learnt less under App. B.4's 330-token instruction (docs/training.md)
COMPACT_PROMPT = (
    "Answer the question. Think inside <think> and </think>. Search only when you lack knowledge: "
    "write a few keywords (not a question) between <search> and </search>; results come back "
    "between <information> and </information>. After each result, reflect inside <reflect> and "
    "</reflect> on what it tells you. When you know the answer, write it between <answer> and "
    "</answer> with no explanation."
)


class Curriculum(CurriculumState):
    """The two-stage schedule: stage 1 then, once, stage 2.

    ``mode="steps"`` switches at ``switch_step``; ``mode="plateau"`` switches when the EMA of the
    mean reward improves by less than ``eps`` for ``patience`` consecutive checks. The whole state
    round-trips through :meth:`to_dict` / :meth:`from_dict`, so training resumes where it stopped.

    A ``steps`` schedule with ``switch_step <= 0`` starts in stage 2: its first step already trains
    with stage-2 rewards (a pipeline's stage-2 segment is such a job; checked only after a step, a
    one-step segment would train entirely in stage 1).
    """

    model_config = ConfigDict(extra="forbid")

    stage: Literal[1, 2] = 1
    mode: Literal["steps", "plateau"] = "steps"
    switch_step: int = 100
    ema_decay: float = 0.9
    eps: float = 0.01
    patience: int = 3
    ema: float | None = None
    flat_checks: int = 0
    switched_at: int | None = None

    @model_validator(mode="after")
    def _from_step_zero(self) -> Curriculum:
        if self.mode == "steps" and self.switch_step <= 0 and self.stage == 1:
            self.stage, self.switched_at = 2, 0
        return self

    def update(self, step: int, mean_reward: float | None = None) -> bool:
        """Record one check at training ``step``; returns True when this call switched stage."""
        if self.stage == 2:
            return False
        if self.mode == "steps":
            switch = step >= self.switch_step
        else:
            if mean_reward is None:
                raise ValueError("plateau mode needs the mean reward of each check")
            if self.ema is None:
                self.ema = mean_reward
                return False
            new = self.ema_decay * self.ema + (1 - self.ema_decay) * mean_reward
            self.flat_checks = self.flat_checks + 1 if new - self.ema < self.eps else 0
            self.ema = new
            switch = self.flat_checks >= self.patience
        if switch:
            self.stage, self.switched_at = 2, step
        return switch


class WhenToSearchConfig(SearchR1Config):
    top_k: int = 5
    max_turns: int = 5
    system_prompt: str = WHEN_TO_SEARCH_PROMPT
    b: float = 0.3
    concise_max_words: int = 6
    question_words: tuple[str, ...] = QUESTION_WORDS
    format_rule: Literal["paper", "lenient"] = "paper"
    #: r_s's avg_sim: "eq8" divides the sum over i < j by N(N-1) as Eq. 8 prints; "pairs" by the
    #: N(N-1)/2 pairs (the mean of pairwise cosines, the project's earlier reading)
    avg_sim: Literal["eq8", "pairs"] = "eq8"
    correct_metric: Literal["judge", "em", "containment"] = "judge"
    expert: Literal["hops", "adaptive", "hops-adaptive"] = "hops"
    curriculum: Literal["steps", "plateau"] = "steps"
    switch_step: int = 100
    ema_decay: float = 0.9
    plateau_eps: float = 0.01
    plateau_patience: int = 3


def is_concise(query: str, max_words: int = 6, question_words: Sequence[str] = QUESTION_WORDS) -> bool:
    """At most ``max_words`` words and not phrased as a question."""
    words = query.split()
    if not words or len(words) > max_words or query.rstrip().endswith("?"):
        return False
    return words[0].lower().strip("\"'(") not in question_words


def keyword_query(question: str, max_words: int = 6, question_words: Sequence[str] = QUESTION_WORDS) -> str:
    """The question as a concise query: its words without question and function words, and, while
    still longer than ``max_words``, without its first lower-case word (names are kept longest)."""
    drop = {*question_words, *FUNCTION_WORDS}
    words = [w for w in re.findall(r"[\w'-]+", question) if w.lower() not in drop]
    while len(words) > max_words:
        lower = next((i for i, w in enumerate(words) if w[0].islower()), 0)
        del words[lower]
    return " ".join(words)


def well_formed(text: str, rule: Literal["paper", "lenient"] = "paper") -> bool:
    """The r_f rule of the module docstring."""
    parsed = parse_tags(text, TAGS)
    if not parsed.ok or outside_text(text, parsed.blocks):
        return False
    return bool(SEQUENCES[rule].fullmatch(" ".join(t for t in parsed.tags if t != "information")))


def search_queries(completions: Sequence[Any], episodes: Sequence[Episode] | None) -> list[list[str]]:
    """The queries of each completion: the episode's, else the ``<search>`` blocks."""
    if episodes is not None:
        return [e.queries for e in episodes]
    return [parse_tags(t, TAGS).contents("search") for t in generated_texts(completions)]


def search_score(queries: list[str], cfg: WhenToSearchConfig) -> float:
    """r_s for one completion."""
    if not queries:
        return 0.0
    if len(queries) == 1:
        return 0.0 if is_concise(queries[0], cfg.concise_max_words, cfg.question_words) else -1.0
    # Imported here: torch + transformers take seconds to import, and only RC > 1 needs them.
    from hoprl.embedding import get_embedder

    sim = get_embedder().similarity(queries, queries)
    pairs = list(itertools.combinations(range(len(queries)), 2))
    n = len(queries)
    denominator = n * (n - 1) if cfg.avg_sim == "eq8" else len(pairs)
    return -float(sum(sim[i, j] for i, j in pairs) / denominator)


def answer_score(correct: bool, rc: int, stage: int, b: float) -> float:
    """r_a for one completion."""
    if stage == 1:
        return 1.0 if correct else -1.0 + b * rc
    return 1.0 - b * rc if correct else -1.0


class WhenToSearch(SearchR1):
    """Search-R1 plus ``<reflect>``; reward r_a + r_s + r_f with a two-stage curriculum."""

    name: ClassVar[str] = "when-to-search"
    review_tag: ClassVar[str] = "reflect"
    tags: ClassVar[list[str]] = TAGS
    config: WhenToSearchConfig

    def __init__(self, judge: Judge | None = None, **config: Any) -> None:
        self.config = WhenToSearchConfig(**config)
        self.top_k = self.config.top_k
        self.max_steps = self.config.max_turns  # the runner's cap for this recipe
        self.judge = judge  # decides correctness when correct_metric == "judge"; None = EM
        c = self.config
        self.curriculum = Curriculum(
            mode=c.curriculum,
            switch_step=c.switch_step,
            ema_decay=c.ema_decay,
            eps=c.plateau_eps,
            patience=c.plateau_patience,
        )

    def expert_reader(self, question: Question) -> Callable[[list[dict[str, str]]], str] | None:
        """The ``"adaptive"`` and ``"hops-adaptive"`` experts as a function of the conversation so
        far (see the module docstring); ``None`` for the scripted ``"hops"`` expert.

        First turn: search the question's keywords (``"adaptive"``) or the first gold hop's own
        query (``"hops-adaptive"``). Each later turn: reflect on the gold hops the last results
        added, then search the first gold hop not yet seen in any results (its own query, once),
        else answer.
        """
        cfg, hops = self.config, hops_for(question)
        if cfg.expert == "hops" or (cfg.expert == "hops-adaptive" and not hops):
            return None
        first_hop = hops[0] if cfg.expert == "hops-adaptive" else None
        first = first_hop.query if first_hop else keyword_query(question.question, cfg.concise_max_words,
                                                                  cfg.question_words)  # fmt: skip

        def reply(messages: list[dict[str, str]]) -> str:
            results = [m["content"] for m in messages[2:] if m["role"] == "user"]
            if not results:
                return expert_search(first, first_hop)
            asked = [m["content"] for m in messages if m["role"] == "assistant"]
            searched = {q for text in asked for q in parse_tags(text, TAGS).contents("search")}
            seen_before = {h.title for h in hops for t in results[:-1] if lists_title(t, h.title)}
            new = [h for h in hops if h.title not in seen_before and lists_title(results[-1], h.title)]
            seen = seen_before | {h.title for h in new}
            reflect = " ".join(hop_fact(h) for h in new) or hop_fact(None)
            missing = [h for h in hops if h.title not in seen and h.query not in searched]
            action = expert_search(missing[0].query, missing[0]) if missing else expert_final(question)
            return f"<reflect>{reflect}</reflect>\n{action}"

        return reply

    def correct(self, prediction: str, golds: list[str], question: str = "") -> bool:
        """Whether ``prediction`` answers correctly, by ``correct_metric`` (see the module docstring)."""
        metric = self.config.correct_metric
        if metric == "judge" and self.judge is not None:
            return self.judge.answer(prediction, golds, question).verdict
        if metric == "containment":
            return containment(prediction, golds) == 1.0
        return exact_match(prediction, golds) == 1.0

    def expert_segments(self, question: Question, noise: float = 0.0, seed: int = 0) -> list[str]:
        """The scripted expert; an answer without any search reflects first (the paper's no-search
        form ``think reflect answer``)."""
        segments = super().expert_segments(question, noise, seed)
        if len(segments) == 1:
            answer = expert_answer(question)
            segments = [
                f"<think>I can answer without searching.</think>\n<reflect>I know that the answer is "
                f"{answer}.</reflect>\n<answer>{answer}</answer>"
            ]
        return segments

    def reward_funcs(self) -> list[RewardFunc]:
        """``[r_f, r_s, r_a]``: TRL sums them into r and logs each; r_a reads the current stage."""
        cfg = self.config

        @versioned("wts_format@2")
        def format_reward(prompts: Any, completions: Sequence[Any], **kw: Any) -> list[float | None]:
            texts = generated_texts(completions, kw.get("episodes"))
            return [1.0 if well_formed(t, cfg.format_rule) else -1.0 for t in texts]

        @versioned("wts_search@2")
        def search_reward(prompts: Any, completions: Sequence[Any], **kw: Any) -> list[float | None]:
            return [search_score(q, cfg) for q in search_queries(completions, kw.get("episodes"))]

        @versioned("wts_answer@2")
        def answer_reward(prompts: Any, completions: Sequence[Any], **kw: Any) -> list[float | None]:
            episodes = kw.get("episodes")
            preds = final_answers(completions, episodes)
            golds = gold_answers(len(preds), kw.get("answers"), episodes)
            rcs = [len(q) for q in search_queries(completions, episodes)]
            questions = [e.question for e in episodes] if episodes else [""] * len(preds)
            stage = self.curriculum.stage
            return [
                answer_score(self.correct(p, g, q), rc, stage, cfg.b)
                for p, g, rc, q in zip(preds, golds, rcs, questions, strict=True)
            ]

        return [format_reward, search_reward, answer_reward]
