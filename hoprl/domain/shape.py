"""The episode shape: every limit and decoding choice of one episode, under one name each.

A run resolves its shape once (a job: :func:`hoprl.jobspec.episode_shape`; the policy service: its
``POLICY_*`` settings over :data:`SHAPE_DEFAULTS` ``["serving"]``; a paper's evaluation: its
protocol) and hands the same frozen object to the trainer's rollouts, the dev checks, ``/v1/answer``
and the evaluations, which read it and never derive it again. :meth:`EpisodeShape.greedy` is the
same shape decoded greedily: what dev checks and evaluations of a trained run use.

The names, everywhere: ``max_steps`` (agent steps, i.e. generated segments, an episode may take),
``max_new_tokens_per_step`` (tokens one step may generate), ``token_budget`` (context growth of the
episode: generated, injected and chat-template tokens), ``top_k`` (documents a search returns;
``None``: the recipe's own), ``temperature``, ``stop`` (stop strings that end a step; ``None``: the
recipe's own), ``search_mode`` and ``grammar`` (decode under the recipe's action grammar).
A recipe's config may name its paper's cap in the paper's notation (EVO-RAG's ``t_max``,
when-to-search's ``max_turns``): that is the recipe's setting, from which a job's ``max_steps``
is derived (:func:`hoprl.jobspec.recipe_derived_defaults`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hoprl.domain.jsontypes import json_typed

SearchMode = Literal["dense", "sparse", "hybrid"]
#: the largest token budget a shape holds (a reasoning model's 16,384-token episodes fit eight times)
MAX_BUDGET = 131072


class EpisodeShape(BaseModel):
    """The limits and decoding of one episode (module docstring); frozen, stored with every run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(ge=1, le=64, description="agent steps (generated segments) per episode")
    max_new_tokens_per_step: int = Field(ge=1, le=32768, description="new tokens one step may generate")
    token_budget: int = Field(
        ge=1, le=MAX_BUDGET, description="context growth per episode (generated + injected + template tokens)"
    )
    top_k: int | None = Field(None, ge=1, le=100, description="documents per search; null: the recipe's")
    temperature: float = Field(0.0, ge=0, le=2, description="0 decodes greedily")
    stop: tuple[str, ...] | None = Field(None, description="stop strings of a step; null: the recipe's")
    search_mode: SearchMode = "hybrid"
    grammar: bool = Field(False, description="decode under the recipe's action grammar")

    @model_validator(mode="before")
    @classmethod
    def _json_types(cls, data: Any) -> Any:
        """JSON's own types, as the published schema has them: no "5" for a number (it travels)."""
        return json_typed(cls, data)

    def greedy(self) -> EpisodeShape:
        """The same shape decoded greedily (dev checks and evaluations of a trained run)."""
        return self.model_copy(update={"temperature": 0.0})

    def limits(self) -> dict[str, int]:
        """The three token and step limits, as a run's report and progress lines print them."""
        return {
            "max_steps": self.max_steps,
            "max_new_tokens_per_step": self.max_new_tokens_per_step,
            "token_budget": self.token_budget,
        }


#: The one table of default shapes. ``paper``: a job's generic fallback under the papers' preset,
#: before configs/<recipe>.yaml and the recipe's own derived cap (EVO-RAG T_max, when-to-search's
#: turns) fill it; ``cpu``: the cpu preset (``make run``: two searches and an answer of 96-token
#: steps fit whole, docs/training.md "One episode shape"); ``serving``: the policy service's
#: /v1/answer when neither the request nor a protocol names a shape (grammar on where the engine
#: constrains; ``POLICY_CONSTRAINED_DECODING``).
SHAPE_DEFAULTS: dict[str, EpisodeShape] = {
    "paper": EpisodeShape(max_steps=4, max_new_tokens_per_step=64, token_budget=512, temperature=1.0),
    "cpu": EpisodeShape(max_steps=4, max_new_tokens_per_step=96, token_budget=1152, temperature=1.0),
    "serving": EpisodeShape(max_steps=10, max_new_tokens_per_step=256, token_budget=2048, grammar=True),
}
