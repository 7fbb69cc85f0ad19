"""Fuzz the policy from its OpenAPI document (:mod:`tests.fuzz`): no 5xx, only declared answers,
JSON error bodies (OpenAI's envelope on the OpenAI routes).

Generation is the expensive part, so the fuzzed service caps it hard (max_tokens 4, one agent
step of 4 tokens); the fuzzer still reaches every route, accepted and rejected. The policy holds
no resources a client creates, so there are no stateful scenarios.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.local import LocalServer
from services.policy.app import create_app
from tests.fuzz import examples, fuzz_clean

from .conftest import small_settings


@pytest.fixture(scope="module")
def fuzzed(indexed: str, model_path: str) -> Iterator[str]:
    tiny = small_settings(
        indexed, model_path, max_tokens=4, max_new_tokens_per_step=4, max_steps=1, max_n=2, max_rollouts=2,
        max_prompt_chars=2000, token_budget=64,
    )  # fmt: skip
    with LocalServer(create_app(tiny)) as server:
        yield server.url


@pytest.mark.slow
def test_no_server_errors(fuzzed: str) -> None:
    report = fuzz_clean(fuzzed, "policy", max_examples=examples(15), timeout=120)
    assert len(report.per_operation) >= 8 and report.statuses[200] > 0
    # The published schema is the enforced one: most schema-valid questions and chats reach the
    # model (they were 24 of 1,106 when the schemas were looser than the validation)
    for label in ("POST /v1/answer", "POST /v1/chat/completions"):
        assert report.reached(label) >= 0.5, (label, sorted(report.positive.items()))


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_a_denormal_temperature_samples_the_top_token(fuzzed: str, stream: bool) -> None:
    """Found by ``make fuzz``: temperature 5e-324 is > 0, so valid, and the sampler divided the raw
    scores by it: they overflowed, the softmax gave NaN and the request a 500. It is greedy now."""
    body = {"prompt": "Velmora is the capital of", "max_tokens": 4, "stream": stream}
    greedy = httpx.post(
        f"{fuzzed}/v1/completions", json=body | {"temperature": 0, "stream": False}, timeout=120
    )
    tiny = httpx.post(
        f"{fuzzed}/v1/completions", json=body | {"temperature": 5e-324, "top_p": 5e-324}, timeout=120
    )
    assert tiny.status_code == 200, tiny.text
    if stream:
        assert '"error"' not in tiny.text and tiny.text.rstrip().endswith("data: [DONE]"), tiny.text
    else:
        assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
