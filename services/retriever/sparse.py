"""BM25 as Qdrant sparse vectors.

Qdrant stores the term-frequency half of BM25 in each document vector and multiplies in the IDF
half at query time when the sparse vector is configured with ``Modifier.IDF``
(idf = ln(1 + (N - n + 0.5) / (n + 0.5)), computed by the engine over the collection). So a
document's value for term t is ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))`` and a
query's value is 1.0 per distinct term; their dot product with IDF applied is the BM25 score.

Written here rather than taken from fastembed's ``Qdrant/bm25`` because that model downloads its
stopword and stemmer files from a hub at first use, which offline machines cannot do.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import snowballstemmer

# A fixed English stopword list (function words only), so scores never depend on a download.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves s t also""".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    return str(_stemmer.stemWord(word))


def tokenize(text: str) -> list[str]:
    """Lowercase, split on non-word characters, drop stopwords, Snowball-stem."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def term_id(token: str) -> int:
    """Stable 31-bit id of a token (CRC32: the same in every process and on every machine)."""
    return zlib.crc32(token.encode("utf-8")) & 0x7FFFFFFF


@dataclass(frozen=True)
class Bm25:
    """Encode documents and queries as BM25 sparse vectors (see the module docstring).

    Args:
        k1: term-frequency saturation.
        b: length normalisation strength.
        avgdl: mean document length in tokens for the collection (fixed when it is created).
    """

    k1: float = 1.2
    b: float = 0.75
    avgdl: float = 100.0

    def document(self, text: str) -> tuple[list[int], list[float]]:
        tokens = tokenize(text)
        norm = self.k1 * (1.0 - self.b + self.b * len(tokens) / self.avgdl)
        counts = _merge_collisions(Counter(tokens))
        indices = list(counts)
        return indices, [tf * (self.k1 + 1.0) / (tf + norm) for tf in counts.values()]

    def query(self, text: str) -> tuple[list[int], list[float]]:
        indices = sorted({term_id(t) for t in tokenize(text)})
        return indices, [1.0] * len(indices)


def _merge_collisions(counts: Counter[str]) -> dict[int, float]:
    merged: dict[int, float] = {}
    for token, tf in counts.items():
        tid = term_id(token)
        merged[tid] = merged.get(tid, 0.0) + tf
    return merged


def mean_length(texts: list[str]) -> float:
    """Mean token count, the ``avgdl`` a new collection is created with."""
    return max(1.0, sum(len(tokenize(t)) for t in texts) / max(1, len(texts)))
