"""Fuzz the judge from its OpenAPI document (:mod:`tests.fuzz`): no 5xx, only declared answers,
JSON error bodies. The judge holds no resources, so there are no stateful scenarios."""

from __future__ import annotations

from tests.fuzz import examples, fuzz_clean


def test_no_server_errors(rules_url: str) -> None:
    report = fuzz_clean(rules_url, "judge", max_examples=examples())
    # The fuzzer really called every operation, with more than one case each.
    assert len(report.per_operation) == 4 and report.cases > 4 * examples()
    assert report.statuses[200] > 0
