"""Episodes: one rollout each, keyed by (run, step, question, sample), inserted at most once.

A job's episodes are the trainer's (its rollouts); a pipeline's are the flows' (the Celery
fan-out's ``rollout_episode`` units, delivered at least once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select

from hoprl.domain import Episode
from hoprl.registry.base import RegistryBase
from hoprl.registry.models import EpisodeRow
from hoprl.registry.records import total_reward


class EpisodeRecords(RegistryBase):
    def write_episodes(
        self, run_id: str, step: int, episodes: Sequence[Episode], rewards: Sequence[Mapping[str, Any]]
    ) -> int:
        """Insert the step's episodes unless already stored; returns how many were new.

        Args:
            episodes: keyed by their ``question_id`` and ``sample``.
            rewards: one dict per episode with every reward signal (name -> value); the stored
                total is :func:`total_reward` of it.
        """
        if len(episodes) != len(rewards):
            raise ValueError(
                f"got {len(episodes)} episodes but {len(rewards)} reward dicts; pass one per episode"
            )
        if not episodes:
            return 0
        rows = [
            {
                "run_id": run_id,
                "step": step,
                "question_id": ep.question_id,
                "sample": ep.sample,
                "trajectory": ep.model_dump(mode="json"),
                "rewards": dict(r),
                "total_reward": total_reward(r),
            }
            for ep, r in zip(episodes, rewards, strict=True)
        ]
        # One lock order for every writer: two transactions inserting overlapping keys in
        # opposite orders would otherwise deadlock on PostgreSQL's unique index.
        rows.sort(key=lambda row: (row["question_id"], row["sample"]))
        stmt = self._insert(EpisodeRow).on_conflict_do_nothing().returning(EpisodeRow.id)
        with self._transaction() as s:
            self._check_run(s, run_id, "episodes")
            return len(s.execute(stmt, rows).all())

    def count_episodes(self, run_id: str, step: int | None = None) -> int:
        query = select(func.count()).select_from(EpisodeRow).where(EpisodeRow.run_id == run_id)
        if step is not None:
            query = query.where(EpisodeRow.step == step)
        with self._transaction() as s:
            return s.scalars(query).one()

    def episodes(self, run_id: str, step: int | None = None) -> list[EpisodeRow]:
        """Stored episodes by (step, question, sample); ``Episode.model_validate(row.trajectory)``
        gives back the agent's episode."""
        order = (EpisodeRow.step, EpisodeRow.question_id, EpisodeRow.sample)
        query = select(EpisodeRow).where(EpisodeRow.run_id == run_id).order_by(*order)
        if step is not None:
            query = query.where(EpisodeRow.step == step)
        with self._transaction() as s:
            return list(s.scalars(query))
