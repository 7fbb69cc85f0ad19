"""Evaluations and their per-question predictions (the flows'), and the paired comparison of two."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import InstrumentedAttribute

from hoprl.metrics.stats import BootstrapResult, paired_bootstrap
from hoprl.registry.base import RegistryBase
from hoprl.registry.models import EvaluationRow, PredictionRow
from hoprl.registry.records import Prediction

log = logging.getLogger("hoprl.registry.store")

# Per-question scores that ``compare`` can pair; judge verdicts must exist for "judge".
COMPARABLE: dict[str, InstrumentedAttribute[Any]] = {
    "em": PredictionRow.em,
    "f1": PredictionRow.f1,
    "judge": PredictionRow.judge_verdict,
    "refused": PredictionRow.refused,
    "retrieval_count": PredictionRow.retrieval_count,
    "latency": PredictionRow.latency,
}


class EvaluationRecords(RegistryBase):
    def add_evaluation(
        self,
        run_id: str,
        dataset: str,
        split: str,
        metrics: Mapping[str, Any],
        predictions: Sequence[Prediction | Mapping[str, Any]],
        checkpoint: int | None = None,
    ) -> int:
        """Store an evaluation with its per-question predictions; returns the evaluation id.

        Args:
            metrics: the aggregate metrics (EM, F1, judge accuracy, recall, ...) as reported.
            predictions: one per question, as :class:`Prediction` or a dict of its fields.
            checkpoint: id of the evaluated checkpoint (:meth:`add_checkpoint`), if any.
        """
        self._check_table("evaluations")
        rows = [Prediction.model_validate(p) for p in predictions]
        with self._transaction() as s:
            self._run(s, run_id)
            self._check_run(s, run_id, "evaluations")
            evaluation = EvaluationRow(
                run_id=run_id, checkpoint_id=checkpoint, dataset=dataset, split=split, metrics=dict(metrics)
            )
            s.add(evaluation)
            s.flush()
            s.add_all(PredictionRow(evaluation_id=evaluation.id, **p.model_dump()) for p in rows)
            return evaluation.id

    def get_evaluation(self, evaluation_id: int) -> EvaluationRow | None:
        with self._transaction() as s:
            return s.get(EvaluationRow, evaluation_id)

    def predictions(self, evaluation_id: int) -> list[PredictionRow]:
        query = (
            select(PredictionRow).filter_by(evaluation_id=evaluation_id).order_by(PredictionRow.question_id)
        )
        with self._transaction() as s:
            return list(s.scalars(query))

    def compare(
        self,
        evaluation_a: int,
        evaluation_b: int,
        metric: str = "em",
        n_resamples: int = 10_000,
        seed: int = 0,
    ) -> BootstrapResult:
        """Paired bootstrap of ``mean(a) - mean(b)`` over the questions both evaluations scored.

        ``metric`` is a per-question column: one of :data:`COMPARABLE`. Questions only one side
        has are left out (and logged); ``result.n`` is the number of pairs.
        """
        if metric not in COMPARABLE:
            raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(COMPARABLE)}")
        a, b = self._scores(evaluation_a, metric), self._scores(evaluation_b, metric)
        shared = sorted(a.keys() & b.keys())
        if not shared:
            raise ValueError(
                f"evaluations {evaluation_a} and {evaluation_b} share no question ids; "
                "evaluate both on the same questions to compare them"
            )
        if len(shared) < max(len(a), len(b)):
            log.warning(
                "comparing evaluations %s and %s on the %d shared questions of %d and %d",
                evaluation_a,
                evaluation_b,
                len(shared),
                len(a),
                len(b),
            )
        return paired_bootstrap(
            [a[q] for q in shared], [b[q] for q in shared], n_resamples=n_resamples, seed=seed
        )

    def _scores(self, evaluation_id: int, metric: str) -> dict[str, float]:
        query = select(PredictionRow.question_id, COMPARABLE[metric]).filter_by(evaluation_id=evaluation_id)
        with self._transaction() as s:
            rows = s.execute(query).all()
        missing = [qid for qid, value in rows if value is None]
        if missing:
            raise ValueError(
                f"evaluation {evaluation_id} has no {metric!r} score for {len(missing)} questions "
                f"(e.g. {missing[0]!r}); run the judge on them or compare on 'em' / 'f1'"
            )
        return {qid: float(value) for qid, value in rows}
