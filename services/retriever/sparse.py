"""BM25 as Qdrant sparse vectors.

Qdrant stores the term-frequency half of BM25 in each document vector and multiplies in the IDF
half at query time when the sparse vector is configured with ``Modifier.IDF``
(idf = ln(1 + (N - n + 0.5) / (n + 0.5)), computed by the engine over the collection). So a
document's value for term t is ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))`` and a
query's value is 1.0 per distinct term; their dot product with IDF applied is the BM25 score.

Written here rather than taken from fastembed's ``Qdrant/bm25`` because that model downloads its
stopword and stemmer files from a hub at first use, which offline machines cannot do.

Equal scores are ordered the same way in every build (:func:`tie_factor`). Qdrant returns the points
of one prefetch list that score exactly alike in an order of its own, which differs between two
collections built from the same documents in the same batches: of a 50-point BM25 list, two such
builds held different points at ranks 49 and 50, all scoring 1.937107801437378 (2026-12-01). Through
the RRF fusion and the feedback round that changed hybrid results, and with them the expert
episodes a warm start trains on (537 of 600 differed between two indexes of one ``synthetic:1:2``
corpus). So each document's weights carry a factor ``1 + TIE_BREAK * u`` with ``u`` in [0, 1) from
its id: exact ties fall in the order of ``u`` in every build, while scores more than 0.01% apart keep
their order. The engine's fusion stays (fusing here settled ties too, at 1.5-1.8x the hybrid p50).
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


#: the relative spread of the per-document tie-break (module docstring): far above float32's
#: rounding of a BM25 sum (about 1e-7), far below any gap between two scores that differ in substance
TIE_BREAK = 1e-4


def tie_factor(key: str) -> float:
    """``1 + TIE_BREAK * u``, ``u = CRC32(key) / 2**32`` in [0, 1): the same for a document id in
    every process and on every machine (module docstring)."""
    return 1.0 + TIE_BREAK * (zlib.crc32(key.encode("utf-8")) / 2**32)


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

    def document(self, text: str, key: str | None = None) -> tuple[list[int], list[float]]:
        """The document half of BM25; with ``key`` (its id) every weight times :func:`tie_factor`,
        which orders documents that would score alike by their ids' hashes."""
        tokens = tokenize(text)
        norm = self.k1 * (1.0 - self.b + self.b * len(tokens) / self.avgdl)
        counts = _merge_collisions(Counter(tokens))
        indices = list(counts)
        factor = 1.0 if key is None else tie_factor(key)
        return indices, [factor * tf * (self.k1 + 1.0) / (tf + norm) for tf in counts.values()]

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
