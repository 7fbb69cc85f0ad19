"""Fuzz the policy from its OpenAPI document (:mod:`tests.fuzz`): no 5xx, only declared answers,
JSON error bodies (OpenAI's envelope on the OpenAI routes).

Generation is the expensive part, so the fuzzed service caps it hard (max_tokens 4, one agent
step of 4 tokens); the fuzzer still reaches every route, accepted and rejected. The policy holds
no resources a client creates, so there are no stateful scenarios.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.local import LocalServer
from services.policy.app import create_app
from tests.fuzz import examples, fuzz, save

from .conftest import small_settings


@pytest.fixture(scope="module")
def fuzzed(indexed: str, model_path: str) -> Iterator[str]:
    tiny = small_settings(
        indexed, model_path, max_tokens=4, max_tokens_per_step=4, max_steps=1, max_n=2, max_rollouts=2,
        max_prompt_chars=2000, token_budget=64,
    )  # fmt: skip
    with LocalServer(create_app(tiny)) as server:
        yield server.url


@pytest.mark.slow
def test_no_server_errors(fuzzed: str) -> None:
    report = fuzz(fuzzed, "policy", examples(15), timeout=120)
    save(report)
    assert report.failures == [], "\n".join(report.failures)
    assert len(report.per_operation) >= 8
    assert report.statuses[200] > 0 and any(400 <= s < 500 for s in report.statuses)
