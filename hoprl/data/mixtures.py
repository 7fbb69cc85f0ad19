"""The papers' training sets, built the way each paper builds it (``paper.training_data`` of
``configs/<recipe>.yaml``; docs/papers.md cites each one).

A training set is a list of parts ``dataset:split[:n]``: ``n`` questions drawn uniformly at random
from that split (without ``n``, the whole split, shuffled), merged in order. The validation parts
are drawn from the same shuffled pools before the training parts, so the two never share a
question (R2AG's 150 2WikiMultiHopQA and 150 MuSiQue validation trees come from the training
splits); ``dev_share`` instead moves that share of each training pool to validation
(when-to-search's 80/20 split of 2WikiMultiHopQA). Questions whose text (lowercased, spaces
collapsed) appears in an ``exclude`` set are kept out of training, and a question repeated in a
split counts once (EVO-RAG deduplicates question strings and keeps every evaluation item out of training). One
``seed`` orders every pool, so the same config gives the same questions on every machine with the
same source files.

Two sources, named explicitly: the Hugging Face hub (:func:`hoprl.data.hub.load_hub`), or a folder
of common-schema files named ``<dataset>_<split>.jsonl`` (``../shared/data``). A folder holds
samples of a few datasets: a part it lacks is skipped and the record lists it, and a part larger
than its file takes the whole file and records both counts.

>>> spec = TrainingData(train=["hotpotqa:train:1000"], exclude=["hotpotqa:dev"])
>>> built = build(spec, "../shared/data")                          # doctest: +SKIP
>>> built.record["parts"][0]                                       # doctest: +SKIP
{'part': 'hotpotqa:train:1000', 'role': 'train', 'available': 110, 'taken': 110}
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hoprl.data.jsonl import DataError, load_questions
from hoprl.domain import Question

PART = re.compile(r"^(?P<dataset>[a-z0-9-]+):(?P<split>train|dev|test)(?::(?P<n>[1-9][0-9]*))?$")

Loader = Callable[[str, str], list[Question] | None]  # (dataset, split) -> questions, None = absent


class TrainingData(BaseModel):
    """A paper's training set (the ``paper.training_data`` section of its config)."""

    model_config = ConfigDict(extra="forbid")

    train: list[str] = Field(min_length=1, description="parts dataset:split[:n], merged in order")
    dev: list[str] = Field(default_factory=list, description="validation parts (after the train draws)")
    dev_share: float | None = Field(None, gt=0, lt=1, description="share of each train pool to validation")
    exclude: list[str] = Field(default_factory=list, description="sets whose questions never train")
    seed: int = Field(0, ge=0, description="orders every pool")

    @field_validator("train", "dev", "exclude")
    @classmethod
    def _parts(cls, parts: list[str]) -> list[str]:
        for part in parts:
            if not PART.match(part):
                raise ValueError(f"{part!r} is not dataset:split[:n] (e.g. hotpotqa:train:1000)")
        return parts


def parse_part(part: str) -> tuple[str, str, int | None]:
    """``"hotpotqa:train:1000"`` -> ``("hotpotqa", "train", 1000)``."""
    match = PART.match(part)
    if match is None:
        raise DataError(f"{part!r} is not dataset:split[:n]")
    n = match["n"]
    return match["dataset"], match["split"], int(n) if n else None


def question_key(text: str) -> str:
    """The text two questions are the same by: lowercased, spaces collapsed."""
    return " ".join(text.lower().split())


@dataclass
class Built:
    """The questions of each split and the record of how they were drawn (stored in the registry)."""

    splits: dict[str, list[Question]]
    record: dict[str, Any] = field(default_factory=dict)


def folder_loader(folder: str | Path) -> Loader:
    """Read ``<folder>/<dataset>_<split>.jsonl``; None when the folder has no such file."""

    def load(dataset: str, split: str) -> list[Question] | None:
        path = Path(folder) / f"{dataset}_{split}.jsonl"
        return load_questions(path) if path.is_file() else None

    return load


def hub_loader(dataset: str, split: str) -> list[Question]:
    """The whole split from the Hugging Face hub (:data:`hoprl.data.hub.HUB`)."""
    from hoprl.data.hub import load_hub

    return load_hub(dataset, split)


def build(spec: TrainingData, source: str | Path | None = None, loader: Loader | None = None) -> Built:
    """The ``train`` and ``dev`` questions ``spec`` describes.

    Args:
        source: a folder of ``<dataset>_<split>.jsonl`` files; None = the hub.
        loader: reads one split (tests pass their own rows); default: from ``source``.
    """
    if loader is None:
        loader = folder_loader(source) if source is not None else hub_loader
    record: dict[str, Any] = {
        "source": str(source) if source is not None else "hub",
        "seed": spec.seed,
        "dev_share": spec.dev_share,
        "parts": [],
        "missing": [],
    }
    excluded: set[str] = set()
    for part in spec.exclude:
        dataset, split, _ = parse_part(part)
        questions = loader(dataset, split)
        if questions is None:
            record["missing"].append(part)
        else:
            excluded |= {question_key(q.question) for q in questions}
    pools: dict[tuple[str, str], list[Question]] = {}
    removed = {"excluded": 0, "duplicates": 0}

    def pool(dataset: str, split: str) -> list[Question] | None:
        """The split without repeated questions, in the seed's order (loaded once)."""
        if (dataset, split) not in pools:
            questions = loader(dataset, split)
            if questions is None:
                return None
            seen: set[str] = set()
            kept = []
            for q in questions:
                key = question_key(q.question)
                if key in seen:
                    removed["duplicates"] += 1
                else:
                    seen.add(key)
                    kept.append(q)
            random.Random(f"{spec.seed}:{dataset}:{split}").shuffle(kept)
            pools[(dataset, split)] = kept
        return pools[(dataset, split)]

    splits: dict[str, list[Question]] = {"train": [], "dev": []}
    # validation parts draw first: they are small, and a folder's short samples then still
    # validate; the training parts draw from what is left, so the two never share a question
    for role, parts in (("dev", spec.dev), ("train", spec.train)):
        for part in parts:
            dataset, split, n = parse_part(part)
            questions = pool(dataset, split)
            if questions is None:
                record["missing"].append(part)
                continue
            if role == "train":
                if spec.dev_share is not None:
                    cut = round(len(questions) * spec.dev_share)
                    splits["dev"] += questions[:cut]
                    questions = questions[cut:]
                allowed = [q for q in questions if question_key(q.question) not in excluded]
                removed["excluded"] += len(questions) - len(allowed)
                questions = allowed
            taken = questions[:n] if n is not None else list(questions)
            pools[(dataset, split)] = questions[len(taken) :]  # a later part draws after these
            splits[role] += taken
            counts = {"available": len(questions), "taken": len(taken)}
            record["parts"].append({"part": part, "role": role, **counts})
    if not splits["train"]:
        raise DataError(f"no training questions: the source has none of {', '.join(spec.train)}")
    record |= removed
    record["counts"] = {split: len(questions) for split, questions in splits.items()}
    return Built(splits, record)


@functools.lru_cache(maxsize=4)
def paper_training_set(recipe: str, folder: str | None = None) -> Built:
    """The training set of ``configs/<recipe>.yaml`` (its ``paper.training_data``), from ``folder``
    or, without one, from the hub; built once per process (the trainer reads train, then dev)."""
    from hoprl.configs import ConfigError, paper_section

    section = paper_section(recipe).get("training_data")
    if section is None:
        raise ConfigError(f"configs/{recipe}.yaml has no paper.training_data section")
    built = build(TrainingData.model_validate(section), folder)
    built.record = {"recipe": recipe, **built.record}
    return built


def paper_spec(spec: str) -> tuple[str, str | None] | None:
    """``"paper:evo-rag"`` -> ``("evo-rag", None)``; ``"paper:r2ag:../shared/data"`` ->
    ``("r2ag", "../shared/data")``; None for a spec that is not a paper's training set."""
    kind, _, rest = spec.partition(":")
    if kind != "paper" or not rest:
        return None
    recipe, _, folder = rest.partition(":")
    return recipe, folder or None
