"""Fuzz the policy's OpenAPI spec: no 5xx, and every 4xx carries a JSON error body.

Generation is the expensive part, so the fuzzed service caps it hard (max_tokens 4, one agent
step of 4 tokens); the fuzzer still reaches every route, accepted and rejected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from services.local import LocalServer
from services.policy.app import create_app

from .conftest import small_settings

EXAMPLES_PER_OPERATION = 15


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
    schema = schemathesis.openapi.from_url(f"{fuzzed}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    statuses: list[int] = []
    assert len(operations) >= 8, [op.label for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            response = case.call(timeout=120)
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if response.status_code >= 400:
                body = response.json()
                if isinstance(body["error"], dict):  # OpenAI's envelope, on the OpenAI-compatible routes
                    body = body["error"]
                assert {"error", "message"} <= set(body) or {"message", "code"} <= set(body), body

        check()
    assert len(statuses) > 4 * len(operations)
    assert any(s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
