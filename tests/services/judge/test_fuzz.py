"""Fuzz the judge's OpenAPI spec: no 5xx, and every 4xx carries a JSON error body."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

EXAMPLES_PER_OPERATION = 40


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(rules_url: str, mode: GenerationMode) -> None:
    """Positive cases follow the schema; negative ones break it (wrong types, missing fields)."""
    schema = schemathesis.openapi.from_url(f"{rules_url}/openapi.json")
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results) == 4, results
    if mode == GenerationMode.NEGATIVE:  # only request bodies can be broken; GETs take no input
        operations = [op for op in operations if op.method.upper() == "POST"]
    statuses: list[int] = []
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            response = case.call()
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if response.status_code >= 400:
                body = response.json()
                assert {"error", "message"} <= set(body), body

        check()
    # The fuzzer really called the service and reached the answers this mode should produce.
    assert len(statuses) > 5 * len(operations)
    if mode == GenerationMode.POSITIVE:
        assert any(s < 300 for s in statuses)
    else:
        assert any(400 <= s < 500 for s in statuses)
