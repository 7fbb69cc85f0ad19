"""BM25 sparse vectors: with Qdrant's IDF applied, their dot product is the BM25 score."""

from __future__ import annotations

import math

import pytest

from services.retriever.sparse import TIE_BREAK, Bm25, mean_length, term_id, tie_factor, tokenize


def test_tokenize_lowercases_drops_stopwords_and_stems() -> None:
    assert tokenize("The Runners were RUNNING to the river!") == ["runner", "run", "river"]
    assert tokenize("") == []


def test_term_ids_are_stable_31_bit() -> None:
    assert term_id("river") == term_id("river") != term_id("rivers")
    assert 0 <= term_id("river") < 2**31


def test_document_values_follow_bm25_tf_saturation() -> None:
    bm25 = Bm25(k1=1.2, b=0.75, avgdl=4.0)
    indices, values = bm25.document("river river delta")  # 3 tokens, dl/avgdl = 0.75
    by_id = dict(zip(indices, values, strict=True))
    norm = 1.2 * (1 - 0.75 + 0.75 * 3 / 4.0)
    assert by_id[term_id("river")] == pytest.approx(2 * 2.2 / (2 + norm))
    assert by_id[term_id("delta")] == pytest.approx(1 * 2.2 / (1 + norm))


def test_query_is_one_per_distinct_term() -> None:
    indices, values = Bm25().query("river river delta")
    assert sorted(indices) == sorted({term_id("river"), term_id("delta")}) and values == [1.0, 1.0]


def test_score_matches_textbook_bm25() -> None:
    """Recompute BM25 for one term by hand with Qdrant's idf = ln(1 + (N - n + 0.5)/(n + 0.5))."""
    docs = ["river delta", "river", "mountain pass road"]
    bm25 = Bm25(avgdl=mean_length(docs))
    n, big_n = 2, 3
    idf = math.log(1 + (big_n - n + 0.5) / (n + 0.5))
    dl, avgdl = 2, mean_length(docs)
    expected = idf * 1 * 2.2 / (1 + 1.2 * (1 - 0.75 + 0.75 * dl / avgdl))
    indices, values = bm25.document(docs[0])
    assert idf * dict(zip(indices, values, strict=True))[term_id("river")] == pytest.approx(expected)


def test_tie_factor_is_one_plus_a_hash_fraction_of_the_key() -> None:
    """1 + 1e-4 * CRC32(key) / 2**32, by hand for the key "acme" (CRC32 96,778,814)."""
    assert tie_factor("acme") == pytest.approx(1 + 1e-4 * 96_778_814 / 2**32, rel=1e-12)
    assert all(1.0 <= tie_factor(k) < 1.0 + TIE_BREAK for k in ["", "a", "doc-7", "é"])


def test_a_keyed_document_scales_every_weight_by_its_tie_factor() -> None:
    bm25 = Bm25(k1=1.2, b=0.75, avgdl=4.0)
    plain_ids, plain = bm25.document("river river delta")
    keyed_ids, keyed = bm25.document("river river delta", key="acme")
    assert keyed_ids == plain_ids
    assert keyed == pytest.approx([v * tie_factor("acme") for v in plain], rel=1e-12)
    # two documents of the same text: the one whose key hashes higher scores higher, by under 0.01%
    (_, a), (_, b) = bm25.document("delta", key="acme"), bm25.document("delta", key="brio")
    assert (a[0] > b[0]) == (tie_factor("acme") > tie_factor("brio"))
    assert abs(a[0] - b[0]) < TIE_BREAK * max(a[0], b[0])
