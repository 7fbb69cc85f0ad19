"""Trainer fixtures: a tiny random Llama with the real SmolLM2 tokenizer, a synthetic-world index.

The tiny model (2 layers, width 64) keeps a GRPO step near a second on two CPU cores while using
the real tokenizer and chat template, so masks and episodes are the production ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hoprl.clients.retriever import RetrieverClient
from hoprl.data.corpus import pool
from hoprl.data.synthetic import generate
from hoprl.evaluation import corpus_collection, ensure_indexed
from hoprl.schemas import Question
from services.policy.model import resolve_model
from tests.postgres import admin_url_or_skip, fresh_database

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    return resolve_model(None, ROOT / ".hoprl/models/smollm2-135m-instruct")


def make_tiny_model(tokenizer_path: str, target: Path, seed: int = 0) -> str:
    """A seeded random 2-layer Llama sharing SmolLM2's tokenizer, saved as a checkpoint folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


@pytest.fixture(scope="session")
def tiny_model(tokenizer_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tokenizer_path, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def synthetic() -> dict[str, list[Question]]:
    """A small slice of the synthetic world: 8 train and 4 dev questions."""
    splits = generate(seed=0)
    return {"train": list(splits["train"][:8]), "dev": list(splits["dev"][:4])}


@pytest.fixture(scope="session")
def collection(retriever_url: str, synthetic: dict[str, list[Question]]) -> str:
    """The slice's paragraphs indexed in the live retriever."""
    documents = pool(synthetic["train"] + synthetic["dev"])
    name = corpus_collection("trainer-test", documents)
    with RetrieverClient(retriever_url) as client:
        ensure_indexed(client, name, documents)
    return name


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the real PostgreSQL for this session's trainer services (skips without one)."""
    with fresh_database(admin_url_or_skip()) as url:
        yield url.render_as_string(hide_password=False)
