"""The domain's types, on the core's lowest floor: they import nothing of the project.

A question (:class:`Question`, :class:`Paragraph`), what an episode is made of (:class:`Episode`,
:class:`Step`, :class:`Action`, :class:`RetrievedDoc`, :class:`Completion`, and the token-level
:class:`TokenTrajectory`) and the episode's shape (:class:`EpisodeShape`, :data:`SHAPE_DEFAULTS`).
Every module above (recipes, the agent, generation, training, the wire schemas, the services and
flows) uses these; ``tests/test_layers.py`` keeps the floor clean.
"""

from typing import Any

from hoprl.domain.episode import (
    CUT_OUTCOMES,
    Action,
    ActionKind,
    Completion,
    Episode,
    Outcome,
    RetrievedDoc,
    Step,
    TokenTrajectory,
    cut_shares,
    ended_shares,
)
from hoprl.domain.question import Paragraph, Question
from hoprl.domain.shape import MAX_BUDGET, SHAPE_DEFAULTS, EpisodeShape, SearchMode

#: the recipe registry's names (``hoprl.recipes.RECIPES``; a test keeps the two equal), for the
#: wire schemas, which list them in their OpenAPI documents without importing the recipes
RECIPE_NAMES = ("arena", "eval-rar", "evo-rag", "naive-rag", "r2ag", "search-r1", "when-to-search")


def unknown(kind: str, name: str, valid: dict[str, Any]) -> KeyError:
    """The error every plain-dict registry (recipes, grammars, datasets, protocols) raises for an
    unknown name, listing the valid ones."""
    return KeyError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")


__all__ = [
    "CUT_OUTCOMES",
    "MAX_BUDGET",
    "RECIPE_NAMES",
    "SHAPE_DEFAULTS",
    "Action",
    "ActionKind",
    "Completion",
    "Episode",
    "EpisodeShape",
    "Outcome",
    "Paragraph",
    "Question",
    "RetrievedDoc",
    "SearchMode",
    "Step",
    "TokenTrajectory",
    "cut_shares",
    "ended_shares",
    "unknown",
]
