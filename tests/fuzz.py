"""Fuzz a live service from its own OpenAPI document, the same way for all four services.

:func:`fuzz` loads ``<url>/openapi.json`` with schemathesis and sends every operation
schema-valid requests (positive) and schema-breaking ones (negative: wrong types, missing
fields), then runs stateful scenarios that follow the document's links (create a job, read it,
cancel it; create a collection, ingest, search, delete it). Every response is checked:

- no 5xx (schemathesis' ``not_a_server_error``);
- the status code, content type and body are the ones the operation declares in its OpenAPI
  (``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``);
- the published schema is the enforced one: a schema-valid request is never refused as invalid
  (``positive_data_acceptance``: 2xx, or 401/403/404/409/429), a schema-breaking one never
  accepted (``negative_data_rejection``: a 4xx);
- every 4xx carries a JSON error body: ``{"error", "message"}``, or OpenAI's
  ``{"error": {"message", ...}}`` on the OpenAI-compatible routes.

A failed check does not stop the run: each is recorded with a curl command that repeats the
request, so one run reports every problem it met (:class:`FuzzReport`).

Generation is deterministic: Hypothesis runs with ``derandomize=True`` and no example database,
so the same code sends the same requests and a green run stays green. ``make test`` runs a few
dozen cases per operation; ``make fuzz`` runs the same code with thousands (``FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core import NotSet
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from hoprl.clients.http import API_KEY_ENV

#: the checks every response must pass (our JSON-error-body check runs beside them)
CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    positive_data_acceptance,
    negative_data_rejection,
]
#: cases per operation and mode in the default test run; ``make fuzz`` raises it
QUICK_EXAMPLES = 25


def examples(default: int = QUICK_EXAMPLES) -> int:
    """Cases per operation and mode (and stateful scenarios): ``$FUZZ_EXAMPLES`` (``make fuzz``)
    or ``default``."""
    return int(os.environ.get("FUZZ_EXAMPLES") or default)


def save(report: FuzzReport) -> None:
    """Append the report's summary to ``$FUZZ_REPORT`` when set (``make fuzz`` prints the file)."""
    path = os.environ.get("FUZZ_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(report.summary() + "\n")
            out.writelines(f"  {failure}\n" for failure in report.failures[:10])


def fuzz_clean(url: str, service: str, *, links: tuple[str, ...] = (), **options: Any) -> FuzzReport:
    """The part every service's fuzz test shares: :func:`fuzz` the service (``options`` go to it),
    :func:`save` the report, and assert that no check failed, that both accepted (2xx) and rejected
    (4xx) requests were met, and that the stateful scenarios followed each of ``links`` (a
    transition id's part, e.g. ``"POST /v1/jobs -> [201] GetJob "``). Returns the report for the
    service's own assertions."""
    report = fuzz(url, service, **options)
    save(report)
    assert report.failures == [], "\n".join(report.failures)
    assert any(200 <= s < 300 for s in report.statuses), report.summary()
    assert any(400 <= s < 500 for s in report.statuses), report.summary()
    followed = " ".join(report.transitions)
    for link in links:
        assert link in followed, sorted(report.transitions)
    return report


def deterministic(max_examples: int, **extra: Any) -> settings:
    """Hypothesis settings that send the same requests on every run."""
    return settings(
        max_examples=max_examples,
        derandomize=True,  # the seed comes from the test, not the clock
        database=None,  # no replay of earlier failures: a run depends on the code alone
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # failures are recorded, not shrunk
        print_blob=False,
        **extra,
    )


@dataclass
class FuzzReport:
    """What one fuzz run sent and saw."""

    service: str
    statuses: Counter[int] = field(default_factory=Counter)
    per_operation: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    transitions: Counter[str] = field(default_factory=Counter)
    #: statuses of the schema-valid (positive) cases, per operation: (label, status) -> count
    positive: Counter[tuple[str, int]] = field(default_factory=Counter)
    #: a digest of every generated request (stateful ones aside: they carry ids the service made up);
    #: two runs of the same code print the same one
    requests: Any = field(default_factory=hashlib.sha256)

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    def summary(self) -> str:
        by_class = Counter(f"{status // 100}xx" for status in self.statuses.elements())
        return (
            f"{self.service}: {self.cases} cases over {len(self.per_operation)} operations "
            f"({min(self.per_operation.values(), default=0)}-{max(self.per_operation.values(), default=0)} "
            f"each), {dict(sorted(by_class.items()))}, {self.server_errors} server errors, "
            f"{sum(self.transitions.values())} link transitions, {len(self.failures)} failed checks, "
            f"requests {self.requests.hexdigest()[:12]}"
        )

    def reached(self, label: str, status: int = 200) -> float:
        """The share of ``label``'s schema-valid cases answered ``status`` (0.0 without any)."""
        total = sum(n for (op, _), n in self.positive.items() if op == label)
        return self.positive[(label, status)] / total if total else 0.0

    def record(
        self, case: schemathesis.Case, response: Any, headers: dict[str, str], generated: bool = True
    ) -> None:
        """Count the response and run every check on it; a failure is kept, not raised."""
        meta = case.meta
        if meta is not None and meta.generation.mode == GenerationMode.POSITIVE:
            self.positive[(case.operation.label, response.status_code)] += 1
        if generated:
            body = None if isinstance(case.body, NotSet) else case.body
            sent = (case.method, case.path, case.path_parameters, case.query, case.headers, body)
            self.requests.update(repr(sent).encode("utf-8", "surrogatepass"))
        self.statuses[response.status_code] += 1
        self.per_operation[case.operation.label] += 1
        problems: list[str] = []
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:  # one group of every failed check (a BaseExceptionGroup)
            problems.extend(f"{type(e).__name__}: {str(e).strip()}" for e in group.exceptions)
        except Exception as exc:  # a single failed check
            problems.append(f"{type(exc).__name__}: {str(exc).strip()}")
        problem = error_body_problem(response)
        if problem:
            problems.append(problem)
        if problems and len(self.failures) < 50:
            curl = case.as_curl_command(headers=headers)
            self.failures.append(f"{case.operation.label}: {' | '.join(problems)}\n  {curl}")


def error_body_problem(response: Any) -> str | None:
    """Why a 4xx/5xx body is not one of our two JSON error shapes, or None."""
    if response.status_code < 400:
        return None
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} without a JSON body: {response.text[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):  # OpenAI's envelope
        return None if isinstance(error.get("message"), str) else f"no error.message: {body}"
    if isinstance(error, str) and isinstance(body.get("message"), str):
        return None
    return f"{response.status_code} body is not an error body: {str(body)[:200]}"


@contextmanager
def no_local_constants() -> Iterator[None]:
    """Generation without the literals Hypothesis gathers from the project's imported modules.

    Hypothesis mixes string and number literals of every local module in ``sys.modules`` into the
    values it draws, and the pool grows as modules are imported: which ones depends on the tests
    collected beside this one and on when a service imports lazily (in its server thread, while
    cases are drawn). The same fuzz test then sent other requests from run to run (measured: the
    judge's 4,002 cases differed in 1,121 places between two selections of test files). Hypothesis
    has no setting for it, so its private hook is replaced for the run.
    """
    from hypothesis.internal.conjecture import providers

    original = providers._get_local_constants
    providers._get_local_constants = providers.Constants
    providers.CONSTANTS_CACHE.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()


def auth_headers() -> dict[str, str]:
    """``Authorization`` for services started with ``HOPRL_API_KEY`` set, else nothing."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _takes_input(operation: Any) -> bool:
    """Whether a negative case can break anything: a body, a path or query parameter."""
    return bool(operation.body or operation.path_parameters or operation.query)


def fuzz(
    url: str,
    service: str,
    max_examples: int | None = None,
    stateful_scenarios: int = 0,
    timeout: float = 60.0,
    operations: Callable[[Any], bool] = lambda operation: True,
    reset: Callable[[], None] | None = None,
) -> FuzzReport:
    """Fuzz every operation of the service at ``url`` (positive, then negative), then run
    ``stateful_scenarios`` link-following scenarios; returns the report (it raises nothing).

    ``reset`` puts the service back in one state before every scenario (e.g. empties its tables):
    a scenario's next rule depends on what earlier answers returned, so scenarios that started
    from whatever the previous one left would draw differently from run to run.
    """
    with no_local_constants():
        return _fuzz(url, service, max_examples, stateful_scenarios, timeout, operations, reset)


def _fuzz(
    url: str,
    service: str,
    max_examples: int | None,
    stateful_scenarios: int,
    timeout: float,
    operations: Callable[[Any], bool],
    reset: Callable[[], None] | None,
) -> FuzzReport:
    n = max_examples if max_examples is not None else examples()
    headers = auth_headers()
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers)
    results = list(schema.get_all_operations())
    broken = [str(r) for r in results if not isinstance(r, Ok)]
    report = FuzzReport(service, failures=[f"unusable operation: {b}" for b in broken])
    for result in results:
        if not isinstance(result, Ok) or not operations(result.ok()):
            continue
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode == GenerationMode.NEGATIVE and not _takes_input(operation):
                continue

            @given(case=operation.as_strategy(generation_mode=mode))
            @deterministic(n)
            def run(case: schemathesis.Case) -> None:
                response = case.call(headers=headers, timeout=timeout)
                report.record(case, response, headers)

            try:
                run()
            except Unsatisfiable:  # e.g. a path's free-form string: nothing breaks its schema
                if mode != GenerationMode.NEGATIVE:
                    raise
    if stateful_scenarios:
        stateful(schema, report, stateful_scenarios, headers, timeout, reset)
    return report


def stateful(
    schema: Any,
    report: FuzzReport,
    scenarios: int,
    headers: dict[str, str],
    timeout: float,
    reset: Callable[[], None] | None = None,
) -> None:
    """Scenarios of several calls that follow the OpenAPI links (create -> read -> delete)."""

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            if reset is not None:
                reset()

        def step(self, input: Any) -> Any:
            if input.transition is not None:
                report.transitions[input.transition.id] += 1
            return super().step(input)

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": headers, "timeout": timeout}

        def validate_response(self, response: Any, case: schemathesis.Case, **kwargs: Any) -> None:
            report.record(case, response, headers, generated=False)

    Machine.run(settings=deterministic(scenarios, stateful_step_count=6))
