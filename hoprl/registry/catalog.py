"""Datasets and indexes: what the flows prepared and built (theirs to write)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select

from hoprl.registry.base import RegistryBase
from hoprl.registry.models import DatasetRow, IndexRow


class CatalogRecords(RegistryBase):
    def register_dataset(
        self, name: str, source: str, content_hash: str, counts: Mapping[str, int]
    ) -> DatasetRow:
        """Record a prepared dataset; the same (name, content hash) returns the existing row."""
        self._check_table("datasets")
        values = {"name": name, "source": source, "content_hash": content_hash, "counts": dict(counts)}
        with self._transaction() as s:
            s.execute(self._insert(DatasetRow).values(values).on_conflict_do_nothing())
            query = select(DatasetRow).filter_by(name=name, content_hash=content_hash)
            return s.scalars(query).one()

    def register_index(
        self, collection: str, embedder: str, corpus_hash: str, points: int, dataset_id: int | None = None
    ) -> IndexRow:
        """Record a built collection; the same (collection, embedder, corpus hash) returns the first row."""
        self._check_table("indexes")
        key = {"collection": collection, "embedder": embedder, "corpus_hash": corpus_hash}
        values = {**key, "points": points, "dataset_id": dataset_id}
        with self._transaction() as s:
            s.execute(self._insert(IndexRow).values(values).on_conflict_do_nothing())
            return s.scalars(select(IndexRow).filter_by(**key)).one()
