"""Score episodes with a recipe's own reward functions: the trainer's one reward loop.

Every caller that turns episodes into rewards goes through :func:`score`, the one reward loop:
the trainer's rollouts (:mod:`hoprl.training.rollout`, :mod:`hoprl.training.offpolicy`) call it
with the recipe's reward functions, and :func:`score_episodes` with ``recipe.reward_funcs()``. The
functions are called in TRL's signature with the episodes and the question columns (``answers``,
``gold_titles``, ``paragraphs``), and the optimised total is the sum weighted by
:func:`hoprl.recipes.reward_weights` (``None`` counts as 0, as TRL's nansum).

:func:`explain` is what ``hoprl reward --recipe NAME EPISODE.json`` prints: every reward by its
versioned name, the weighted total, and the per-step signals the rewards left on the steps
(EVO-RAG's seven signals), so a user can see why an episode got its reward::

    report = explain(get_recipe("evo-rag"), Episode.model_validate_json(text))
    report["total"], report["steps"][0]["signals"]["r_ret"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hoprl.domain import Episode, Question
from hoprl.recipes import reward_weights
from hoprl.recipes.baselines import generated_texts


def question_columns(questions: Sequence[Question]) -> dict[str, list[Any]]:
    """The dataset columns reward functions read, one entry per completion."""
    return {
        "answers": [list(q.answers) for q in questions],
        "gold_titles": [list(q.gold_titles) for q in questions],
        "paragraphs": [[p.model_dump() for p in q.paragraphs] for q in questions],
    }


def columns_for(episodes: Sequence[Episode], questions: Sequence[Question | None]) -> dict[str, Any]:
    """The dataset columns the reward functions read, one row per episode.

    A question (from the data file) gives every column; without one, ``answers`` and
    ``gold_titles`` come from the episode, and ``paragraphs`` is left out (a recipe that needs it,
    ARENA, then says so instead of scoring against no references).
    """
    rows = list(zip(episodes, questions, strict=True))
    known = [q for q in questions if q is not None]
    if len(known) == len(rows):
        return question_columns(known)
    return {
        "answers": [list(q.answers) if q else list(e.answers) for e, q in rows],
        "gold_titles": [list(q.gold_titles) if q else list(e.gold_titles) for e, q in rows],
    }


def score(reward_funcs: Sequence[Any], weights: Sequence[float], episodes: list[Episode],
          questions: Sequence[Question | None]) -> tuple[list[dict[str, float]], list[float]]:  # fmt: skip
    """Every reward function on ``episodes``: per-episode ``{name@version: value}`` and the weighted
    total TRL computes too (``None`` rewards count as 0 in the total, as in TRL's nansum)."""
    columns = columns_for(episodes, questions)
    texts = generated_texts([], episodes)
    per: list[dict[str, float]] = [{} for _ in episodes]
    totals = [0.0] * len(episodes)
    for fn, weight in zip(reward_funcs, weights, strict=True):
        name = getattr(fn, "__version__", getattr(fn, "__name__", "reward"))
        values = fn(prompts=[e.question for e in episodes], completions=texts, episodes=episodes, **columns)
        for i, value in enumerate(values):
            if value is not None:
                per[i][name] = float(value)
                totals[i] += weight * float(value)
    return per, totals


def score_episodes(
    recipe: Any, episodes: list[Episode], questions: Sequence[Question | None] | None = None
) -> tuple[list[dict[str, float]], list[float]]:
    """Per episode ``{name@version: value}`` of every reward function, and the weighted total."""
    return score(recipe.reward_funcs(), reward_weights(recipe), episodes, questions or [None] * len(episodes))


def explain(recipe: Any, episode: Episode, question: Question | None = None) -> dict[str, Any]:
    """One episode's rewards as a JSON-ready report (see the module docstring)."""
    if question is not None and question.id != episode.question_id:
        raise ValueError(f"the question {question.id!r} is not the episode's ({episode.question_id!r})")
    (rewards,), (total,) = score_episodes(recipe, [episode], [question])
    weights = dict(zip(rewards_names(recipe), reward_weights(recipe), strict=True))
    return {
        "recipe": recipe.name,
        "question_id": episode.question_id,
        "outcome": episode.outcome,
        "final_answer": episode.final_answer,
        "rewards": rewards,
        "weights": weights,
        "total": total,
        "steps": [
            {"t": s.t, "action": s.action, "queries": s.queries, "signals": s.signals, "error": s.error}
            for s in episode.steps
        ],
    }


def rewards_names(recipe: Any) -> list[str]:
    """The versioned names of ``recipe``'s reward functions, in order."""
    return [getattr(fn, "__version__", getattr(fn, "__name__", "reward")) for fn in recipe.reward_funcs()]


def load_episode(data: Any) -> Episode:
    """An episode from JSON: an Episode, a ``/v1/rollouts`` rollout (``{"episode", "trajectory"}``),
    or a registry episode row (``{"trajectory": Episode, ...}``)."""
    if isinstance(data, dict) and isinstance(data.get("episode"), dict):
        data = data["episode"]
    elif (
        isinstance(data, dict) and isinstance(data.get("trajectory"), dict) and "steps" in data["trajectory"]
    ):
        data = data["trajectory"]
    return Episode.model_validate(data)
