"""One way to name a dataset everywhere: a JSONL path, a hub name, ``synthetic``, or a paper's
training set (``paper:<recipe>[:<folder>]``)."""

from __future__ import annotations

from pathlib import Path

from hoprl.data.hub import HUB, load_hub
from hoprl.data.jsonl import DataError, load_questions
from hoprl.data.mixtures import paper_spec, paper_training_set
from hoprl.domain import Question


def load(spec: str, split: str = "dev", limit: int | None = None, seed: int = 0) -> list[Question]:
    """Load questions from ``spec``.

    - a path to a common-schema JSONL file (e.g. ``../shared/data/hotpotqa_dev.jsonl``), read in place;
    - ``synthetic`` (optionally ``synthetic:SEED``, ``synthetic:SEED:MAX_HOPS`` or
      ``synthetic:SEED:MAX_HOPS:TEST``): the generated multi-hop world, split ``split``
      (``synthetic:0:2``: two-hop questions only; ``synthetic:0:2:300``: the same world and
      questions with a test split of 300, :func:`synthetic_split`);
    - a hub name (``hotpotqa``, ``2wiki``, ``musique``, ``bamboogle``, ``nq``, ``triviaqa``, ``popqa``);
    - ``paper:<recipe>``: the training set the recipe's paper builds (``configs/<recipe>.yaml``,
      :mod:`hoprl.data.mixtures`) from the hub, split ``train`` or ``dev``; ``paper:<recipe>:<folder>``
      builds it from a folder of common-schema files (``../shared/data``). Its sampling seed is the
      config's, not ``seed``: a job's train and dev splits never share a question.
    """
    if Path(spec).exists():
        return load_questions(spec, limit)
    paper = paper_spec(spec)
    if paper is not None:
        splits = paper_training_set(*paper).splits
        if split not in splits:
            raise DataError(f"{spec!r} has the splits {', '.join(splits)}, not {split!r}")
        return list(splits[split][:limit] if limit is not None else splits[split])
    if spec.split(":")[0] == "synthetic":
        questions = synthetic_split(spec, split, seed)
        return questions[:limit] if limit is not None else questions
    if spec in HUB:
        return load_hub(spec, split, limit)
    raise DataError(
        f"{spec!r} is neither a file, 'synthetic', 'paper:<recipe>', nor a hub dataset ({', '.join(HUB)}); "
        "benchmark samples are in ../shared/data"
    )


#: the synthetic world's test split without a TEST field (hoprl.data.synthetic.generate's n_test)
SYNTHETIC_TEST = 150


def synthetic_split(spec: str, split: str, seed: int = 0) -> list[Question]:
    """``split`` of ``synthetic[:SEED[:MAX_HOPS[:TEST]]]`` (SEED defaults to ``seed``).

    TEST sets the test split's size alone: above :data:`SYNTHETIC_TEST` the extra questions are
    drawn after all the others (``generate(extra_test=...)``), below it the test split is cut, so
    every split keeps the questions of the spec without TEST, and train and dev do not change.
    """
    from hoprl.data.synthetic import generate

    parts = spec.split(":")
    if len(parts) > 4 or not all(p.isdigit() for p in parts[1:]):
        raise DataError(
            f"{spec!r}: write synthetic, synthetic:SEED, synthetic:SEED:MAX_HOPS or "
            "synthetic:SEED:MAX_HOPS:TEST"
        )
    world_seed = int(parts[1]) if len(parts) > 1 else seed
    max_hops = int(parts[2]) if len(parts) > 2 else None
    test = int(parts[3]) if len(parts) > 3 else SYNTHETIC_TEST
    if test < 1:
        raise DataError(f"{spec!r}: the test split needs at least one question")
    try:
        splits = generate(seed=world_seed, max_hops=max_hops, extra_test=max(0, test - SYNTHETIC_TEST))
    except ValueError as exc:  # max_hops below 2, a world too small for the extra test questions
        raise DataError(f"{spec!r}: {exc}") from None
    questions: list[Question] = list(splits[split])
    return questions[:test] if split == "test" else questions
