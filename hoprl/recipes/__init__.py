"""The recipe registry: a plain dict from recipe name to recipe class.

>>> recipe = get_recipe("eval-rar", r_eval=0.2)
>>> recipe.name, recipe.top_k
('eval-rar', 3)

Config keyword arguments are validated by the recipe's pydantic config (``extra="forbid"``), so a
misspelt constant fails loudly instead of silently keeping the paper default.
"""

from __future__ import annotations

from typing import Any

from hoprl.domain import unknown
from hoprl.recipes.arena import Arena
from hoprl.recipes.baselines import NaiveRAG, SearchR1
from hoprl.recipes.eval_rar import EvalRAR
from hoprl.recipes.evo_rag import EvoRag
from hoprl.recipes.r2ag import R2ag
from hoprl.recipes.when_to_search import WhenToSearch

RECIPES: dict[str, type[Any]] = {
    "naive-rag": NaiveRAG,
    "search-r1": SearchR1,
    "eval-rar": EvalRAR,
    "arena": Arena,
    "when-to-search": WhenToSearch,
    "evo-rag": EvoRag,
    "r2ag": R2ag,
}


def reward_weights(recipe: Any) -> list[float]:
    """The weight of each of ``recipe.reward_funcs()`` in the optimised reward (default: all 1)."""
    weights = getattr(recipe, "reward_weights", None)
    return list(weights()) if weights else [1.0] * len(recipe.reward_funcs())


def get_recipe(name: str, **config: Any) -> Any:
    """A recipe instance by name, its config overridden by ``config``; unknown names list the valid ones."""
    if name not in RECIPES:
        raise unknown("recipe", name, RECIPES)
    return RECIPES[name](**config)
