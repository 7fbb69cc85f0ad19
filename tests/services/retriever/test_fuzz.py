"""Fuzz the retriever's OpenAPI spec: no 5xx, and every 4xx carries a JSON error body."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

EXAMPLES_PER_OPERATION = 25


def test_no_server_errors(service: str) -> None:
    schema = schemathesis.openapi.from_url(f"{service}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    statuses: list[int] = []
    assert len(operations) >= 8, [op.label for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            response = case.call()
            statuses.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if response.status_code >= 400:
                body = response.json()
                assert {"error", "message"} <= set(body), body

        check()
    # The fuzzer really called the service, and reached both accepted and rejected requests.
    assert len(statuses) > 5 * len(operations)
    assert any(s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
