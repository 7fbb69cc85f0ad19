"""What every recipe module provides: a protocol, reward functions and a curriculum.

A recipe is a plain object with these attributes; the registry in ``hoprl/recipes/__init__.py`` is
a dict from name to recipe class. The episode runner (``hoprl/agent/runner.py``) drives any recipe
through :meth:`Recipe.messages`, :meth:`Recipe.parse` and :meth:`Recipe.information` only.

Rewards follow one signature (TRL's ``RewardFunc``)::

    def reward(prompts, completions, **kwargs) -> list[float | None]

``kwargs`` carries the dataset columns (``answers``, ``gold_titles``, ...) and ``episodes`` (one
:class:`~hoprl.domain.Episode` per completion). ``None`` means "not applicable". Step-level
signals are computed per step (``Step.signals``) and reduced to one number by
:func:`hoprl.recipes.rewards.sequence_reward`. Every reward function carries ``__version__``
(``name@N``), recorded with each score.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, Self

from pydantic import BaseModel

from hoprl.domain import Action, Question, RetrievedDoc

RewardFunc = Callable[..., list[float | None]]


class Recipe(Protocol):
    """Read-only members, so a recipe may set them on the class or from its config per instance.

    Optional hooks the runner looks up with ``getattr``: ``max_steps`` (the recipe's own episode
    cap, e.g. EVO-RAG's T_max), ``retrieve_first`` (retrieve with the question before step 1 and
    call ``messages(question, docs=...)``), ``end_on_format_error`` (default True).
    Optional for trainers: ``reward_weights()`` (one weight per reward function; default all 1),
    so a recipe can return logging-only rewards (weight 0) beside the one it optimises.
    """

    @property
    def name(self) -> str:
        """The registry name, e.g. ``"evo-rag"``."""

    @property
    def stop(self) -> list[str]:
        """Stop sequences that end one generated segment (the runner keeps the stop text)."""

    @property
    def top_k(self) -> int:
        """Documents returned per query."""

    def messages(self, question: Question) -> list[dict[str, str]]:
        """Chat messages before the first step (system prompt, question, references if any)."""

    def parse(self, segment: str) -> Action:
        """Parse one generated segment; malformed text gives ``Action('format_error', error=...)``."""

    def information(self, docs: list[list[RetrievedDoc]]) -> str:
        """Text injected after a search step (mask 0), e.g. ``<information>...</information>``."""

    def reward_funcs(self) -> list[RewardFunc]:
        """Reward functions in TRL's signature, with this recipe's config bound."""

    def expert(self, question: Question, noise: float = 0.0, seed: int = 0) -> str:
        """A scripted expert completion from the gold path, for SFT warm start."""


def versioned(name: str) -> Callable[[RewardFunc], RewardFunc]:
    """Decorator: tag a reward with ``__version__`` (``name@N``) and a readable ``__name__``."""

    def wrap(fn: RewardFunc) -> RewardFunc:
        fn.__version__ = name  # type: ignore[attr-defined]
        fn.__name__ = name.split("@")[0]
        return fn

    return wrap


def alias(fn: RewardFunc, name: str) -> RewardFunc:
    """``fn`` under another versioned ``name`` (:func:`versioned`): the same reward, versioned apart."""

    def same(*args: Any, **kwargs: Any) -> list[float | None]:
        return fn(*args, **kwargs)

    same.__doc__ = fn.__doc__
    return versioned(name)(same)


class CurriculumState(BaseModel):
    """A curriculum whose whole state is its fields: saved in a checkpoint with :meth:`to_dict`,
    restored with :meth:`from_dict` (:class:`hoprl.training.callbacks.Curricula`)."""

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Self:
        return cls.model_validate(state)
