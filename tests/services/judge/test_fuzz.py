"""Fuzz the judge from its OpenAPI document (:mod:`tests.fuzz`): no 5xx, only declared answers,
JSON error bodies. The judge holds no resources, so there are no stateful scenarios."""

from __future__ import annotations

from tests.fuzz import examples, fuzz, save


def test_no_server_errors(rules_url: str) -> None:
    report = fuzz(rules_url, "judge", examples())
    save(report)
    assert report.failures == [], "\n".join(report.failures)
    # The fuzzer really called every operation and met both accepted and rejected requests.
    assert len(report.per_operation) == 4 and report.cases > 4 * examples()
    assert report.statuses[200] > 0 and any(400 <= s < 500 for s in report.statuses)
