"""A synthetic multi-hop world, generated deterministically from a seed.

The world is a set of fictional entities (people, cities, countries, companies, bands, films,
rivers) with made-up pronounceable names, typed attributes (birth year, population, genre, ...)
and functional relations (``born_in``, ``founded_by``, ``located_in``, ...: at most one target
each, so every noun phrase like "the founder of Velmora Records" names exactly one entity).
Each entity has ONE paragraph stating its facts in natural sentences, with a few phrasings.

Questions, in :class:`SyntheticQuestion` (the common :class:`~hoprl.schemas.Question` plus
``hops``, the gold reasoning chain):

* ``bridge-N`` (N = 2..4): a chain of N facts, one paragraph per fact, e.g. "In which country is
  the city where the founder of Velmora Records was born?" (bridge-3).
* ``comparison``: "Which company was founded first, X or Y?" (two paragraphs).
* unanswerable (a configurable share, ``answers == []``): a bridge chain whose last fact was
  *withheld* when the world was built, so no paragraph anywhere states it. Its chain paragraphs
  are still marked gold: they are the evidence one would read before refusing.

Each question carries 10 paragraphs (gold plus look-alike distractors: same kind of entity or a
shared name word), like HotpotQA's distractor setting.

The package in three parts, one module each:

- :mod:`~hoprl.data.synthetic.schema`: :class:`Hop`, :class:`SyntheticQuestion`, reading them
  back (:func:`read_jsonl`) and the hop chain of any question (:func:`hops_for`);
- :mod:`~hoprl.data.synthetic.world`: the entities, their facts and paragraphs (:func:`build_world`);
- :mod:`~hoprl.data.synthetic.questions`: drawing questions over a world (:func:`generate`).

Files are written with :func:`hoprl.data.jsonl.write_questions` (``hops`` included).

>>> splits = generate(seed=1, n_entities=80, n_train=20, n_dev=5, n_test=5)
>>> sorted(splits), len(splits["train"])
(['dev', 'test', 'train'], 20)
"""

from __future__ import annotations

from hoprl.data.synthetic.questions import DATASET, PARAGRAPHS_PER_QUESTION, generate
from hoprl.data.synthetic.schema import Hop, SyntheticQuestion, hops_for, read_jsonl
from hoprl.data.synthetic.world import Entity, World, build_world, render_value

__all__ = [
    "DATASET", "PARAGRAPHS_PER_QUESTION", "Entity", "Hop", "SyntheticQuestion", "World", "build_world",
    "generate", "hops_for", "read_jsonl", "render_value",
]  # fmt: skip
