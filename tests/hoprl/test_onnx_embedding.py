"""The ONNX Runtime embedder: the export matches torch, int8 stays close, the cache is reused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from hoprl.embedding import Embedder, default_model_path
from hoprl.onnx_embedding import SMALL_BATCH, OnnxEmbedder, export
from services.retriever.index import load_embedder
from services.retriever.settings import RetrieverSettings

TEXTS = [
    "Who founded Acme Records?",
    "Acme Records. Acme Records was founded in 1961 by Jane Roe, a producer from Velmora.",
    "Velmora",
    "Jane Roe. Jane Roe was born in Velmora, a city in Ostland on the river Ansk. " * 4,
    "Brio Motors is a car maker founded in 1988 in Tessa.",
    "What river flows through the capital of Ostland?",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def reference() -> Embedder:
    return Embedder(bf16=False, max_length=64)


def test_float32_export_matches_torch_for_any_batch_shape(cache: Path, reference: Embedder) -> None:
    onnx = OnnxEmbedder(quantize=False, max_length=64, batch_size=4, cache=cache)
    expected = reference.encode(TEXTS)
    batched = onnx.encode(TEXTS)  # two padded batches on the multi-thread session
    one_by_one = np.stack([onnx.encode([t])[0] for t in TEXTS])  # unpadded, one-thread session
    assert batched.shape == (len(TEXTS), 384) and batched.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert (batched * expected).sum(1).min() > 0.99999
    assert (one_by_one * expected).sum(1).min() > 0.99999
    assert onnx.name == "all-MiniLM-L6-v2+onnx"


def test_int8_vectors_stay_close_and_rank_the_same(cache: Path, reference: Embedder) -> None:
    int8 = load_embedder(backend="onnx-int8", max_length=64)
    assert int8.name == "all-MiniLM-L6-v2+onnx-int8"
    cos = (int8.encode(TEXTS) * reference.encode(TEXTS)).sum(1)
    assert cos.mean() > 0.99 and cos.min() > 0.97
    questions, passages = [TEXTS[0], TEXTS[5]], TEXTS[1:5]
    for model in (int8, reference):
        best = (model.encode(questions) @ model.encode(passages).T).argmax(1)
        assert [passages[i][:5] for i in best] == ["Acme ", "Jane "]


def test_export_happens_once_per_cache(cache: Path) -> None:
    first = export(default_model_path(), quantize=True, cache=cache)
    stamp = first.stat().st_mtime_ns
    again = export(default_model_path(), quantize=True, cache=cache)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert [p.name for p in first.parent.iterdir()] == ["model-int8.onnx"]  # no temporary left behind


def test_int8_vectors_depend_a_little_on_the_batch(cache: Path) -> None:
    """Dynamic quantisation scales activations per batch, padding included: a text's int8 vector
    moves slightly with its batch neighbours (float32 does not, see the first test)."""
    onnx = OnnxEmbedder(quantize=True, max_length=64, cache=cache)
    assert onnx.encode([]).shape == (0, 384)
    small = onnx.encode(TEXTS[:SMALL_BATCH])
    large = onnx.encode(TEXTS)[:SMALL_BATCH]
    assert 0.98 < (small * large).sum(1).min() < 1.0


def test_onnx_needs_a_local_folder(cache: Path) -> None:
    with pytest.raises(ValueError, match="local model folder"):
        OnnxEmbedder("sentence-transformers/all-MiniLM-L6-v2", cache=cache)


def test_backend_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVER_EMBED_BACKEND", "tensorrt")
    with pytest.raises(ValidationError, match="embed_backend"):
        RetrieverSettings()


def test_query_threads_follow_the_backend() -> None:
    assert RetrieverSettings().search_threads == 0  # every core on onnx-int8, the default
    assert RetrieverSettings(embed_backend="torch").search_threads == 1
    assert RetrieverSettings(embed_backend="torch", query_threads=2).search_threads == 2


def test_the_embedding_modules_import_one_way() -> None:
    """hoprl.onnx_embedding builds on hoprl.embedding; hoprl.embedding never imports it back (the
    backend chooser, load_embedder, lives with the retriever that uses it)."""
    import ast
    from pathlib import Path

    import hoprl.embedding

    tree = ast.parse(Path(hoprl.embedding.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "hoprl.onnx_embedding" not in imported
