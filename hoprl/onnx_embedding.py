"""The dense embedder on ONNX Runtime, with int8 weights: the retriever's default for speed.

The transformers model (mean pooling and L2 normalisation included) is exported once with
``torch.onnx.export`` and, by default, quantised with ONNX Runtime's dynamic int8 quantisation
(per-channel weights). The files are cached under ``~/.cache/hoprl/onnx`` (``HOPRL_CACHE`` moves
it), keyed by the model's files and the library versions, so the export (a few seconds) happens
once per machine.

Why: on this project's 2-core CPU the encoder's forward pass is the whole cost of indexing and of
a single query. int8 halves a single query's encode against float32 and indexes faster than
bfloat16 torch, with vectors at cosine ~0.994 to the float32 ones (docs/retrieval.md has the
measurements and the recall this costs). Written here because no library in the dependency set
exports and quantises a sentence-transformers model without the hub (optimum would add a heavy
dependency for two calls).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hoprl.embedding import DEFAULT_EMBEDDER, TextEncoder, default_model_path
from hoprl.settings import get_settings

# Lists of at most this many texts (a search request's queries) run on a one-thread session:
# a parallel region on a 2-core box waits for a descheduled thread when the other core is busy.
SMALL_BATCH = 4


def cache_root() -> Path:
    return get_settings().cache_dir / "onnx"


def _cache_key(model_path: Path, quantize: bool) -> str:
    import onnxruntime
    import torch
    import transformers

    versions = f"{torch.__version__}|{transformers.__version__}|{onnxruntime.__version__}|{quantize}"
    h = hashlib.sha256(versions.encode())
    for f in sorted(p for p in model_path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(model_path)}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]


def export(model_path: Path, quantize: bool = True, cache: Path | None = None) -> Path:
    """The ONNX file of ``model_path`` (pooled, normalised output), exported on first use.

    Concurrent callers each export into a private temporary folder and move the result into
    place atomically, so a reader never sees a half-written file.
    """
    target_dir = (cache or cache_root()) / f"{model_path.name}-{_cache_key(model_path, quantize)}"
    target = target_dir / ("model-int8.onnx" if quantize else "model.onnx")
    if target.is_file():
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp, _quiet():
        fp32 = Path(tmp) / "model.onnx"
        _export_fp32(model_path, fp32)
        if quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            out = Path(tmp) / "model-int8.onnx"
            quantize_dynamic(fp32, out, weight_type=QuantType.QInt8, per_channel=True)
        else:
            out = fp32
        os.replace(out, target)
    return target


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the tracer's warnings and the quantiser's root-logger advice during an export."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def _export_fp32(model_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    # Eager attention traces to plain matmuls; the SDPA path bakes a Python branch into the trace.
    model = AutoModel.from_pretrained(model_path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sample = tokenizer(["a short text", "a somewhat longer second text"], padding=True, return_tensors="pt")
    names = list(sample.keys())

    class Pooled(torch.nn.Module):
        """Mean pooling over the attention mask, then L2 normalisation, as sentence-transformers."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            kwargs = dict(zip(names, inputs, strict=True))
            hidden = self.model(**kwargs).last_hidden_state
            mask = kwargs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    axes = {n: {0: "batch", 1: "tokens"} for n in names} | {"embedding": {0: "batch"}}
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            Pooled().eval(),
            tuple(sample[n] for n in names),
            str(out),
            input_names=names,
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


class OnnxEmbedder(TextEncoder):
    """Encode texts into L2-normalised float32 vectors with ONNX Runtime.

    Args:
        model: a local folder; ``None`` is the bundled MiniLM.
        max_length: tokens kept per text.
        batch_size: texts per forward pass; batches are formed from length-sorted texts.
        quantize: int8 weights (default) or the float32 export.
        threads: ONNX Runtime threads for batches (0 = one per core).
        query_threads: threads for lists of at most ``SMALL_BATCH`` texts (0 = one per core).
        cache: where exported files live (default :func:`cache_root`).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        max_length: int = 128,
        batch_size: int = 32,
        quantize: bool = True,
        threads: int = 0,
        query_threads: int = 1,
        cache: Path | None = None,
    ) -> None:
        import onnxruntime as ort
        from transformers import AutoTokenizer

        path = Path(model) if model is not None else default_model_path()
        if not path.is_dir():
            raise ValueError(f"the onnx backends need a local model folder, got {model!r}")
        base = DEFAULT_EMBEDDER if model is None else path.name
        self.name = f"{base}+onnx-int8" if quantize else f"{base}+onnx"
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_length = max_length
        self.batch_size = batch_size
        file = str(export(path, quantize, cache))

        def session(n: int) -> ort.InferenceSession:
            options = ort.SessionOptions()
            options.intra_op_num_threads = n
            options.inter_op_num_threads = 1
            return ort.InferenceSession(file, options, providers=["CPUExecutionProvider"])

        self._batch = session(threads)
        self._small = self._batch if query_threads == threads else session(query_threads)
        self._inputs = [i.name for i in self._batch.get_inputs()]
        self.dim = int(self._batch.get_outputs()[0].shape[-1])

    def _forward(self, texts: list[str], total: int) -> np.ndarray:
        runner = self._small if total <= SMALL_BATCH else self._batch
        batch = self._tokens(texts, "np")
        return runner.run(None, {n: batch[n].astype(np.int64) for n in self._inputs})[0]
