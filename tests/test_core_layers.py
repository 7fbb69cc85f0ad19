"""Inside the core: no import cycle anywhere, and ``hoprl/``'s packages import only down their floors.

``tests/test_layers.py`` keeps the outer layers apart (``hoprl`` <- ``services`` <- ``flows`` <-
``cli``); this file reads the same import graph (every import at any depth of the code, function-local
ones included, so a cycle cannot hide inside a function) and checks

- that no module of the project reaches itself again through its imports (a cycle, named whole);
- that each package or module directly under ``hoprl/`` (a *unit*: ``hoprl.recipes``,
  ``hoprl.jobspec``, ...) imports only its own modules and units on lower floors (:data:`FLOORS`).

The floors, lowest first: the domain's types and the plain settings; what scores, embeds and reads
the papers' files; the judge and the int8 encoder; the wire contracts; data and clients; the
recipes and the papers' protocols; the episode runner, the run registry and retrieval evaluation;
generation and job resolution; training and answer evaluation through the services.
"""

from __future__ import annotations

import pytest

from tests.test_layers import graph

#: floor -> the units on it; a unit imports only units on lower floors (and its own modules)
FLOORS: dict[int, frozenset[str]] = {
    0: frozenset({"domain", "settings", "ports", "__init__"}),
    1: frozenset({"metrics", "embedding", "configs"}),
    2: frozenset({"judging", "onnx_embedding"}),
    3: frozenset({"schemas"}),
    4: frozenset({"data", "clients"}),
    5: frozenset({"recipes", "protocols"}),
    6: frozenset({"agent", "registry", "evaluation"}),
    7: frozenset({"generation", "jobspec"}),
    8: frozenset({"training", "answer_eval"}),
}
FLOOR = {unit: floor for floor, units in FLOORS.items() for unit in units}


def unit(module: str) -> str:
    """``hoprl.recipes.evo_rag.reward`` -> ``recipes``; ``hoprl`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def project_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (names that are not modules of the project dropped)."""
    g = graph()
    return {m: {t for t in targets if t in g and t != m} for m, targets in g.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found_when_there_are_some() -> None:
    """The search itself: a two-module cycle hidden in a longer chain is named, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}) == [["b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_among_the_projects_modules() -> None:
    found = cycles(project_graph())
    assert not found, "import cycles (function-local imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_every_unit_of_the_core_has_a_floor() -> None:
    units = {unit(m) for m in graph() if m.split(".")[0] == "hoprl"}
    assert units == set(FLOOR), (
        f"add to FLOORS: {sorted(units - set(FLOOR))}; stale: {sorted(set(FLOOR) - units)}"
    )


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_the_core_imports_only_down_its_floors(floor: int) -> None:
    bad = []
    for module, targets in project_graph().items():
        if module.split(".")[0] != "hoprl" or FLOOR[unit(module)] != floor:
            continue
        for target in sorted(targets):
            if target.split(".")[0] != "hoprl" or unit(target) == unit(module):
                continue
            if FLOOR[unit(target)] >= floor:
                bad.append(f"{module} imports {target} (floor {FLOOR[unit(target)]} >= its own {floor})")
    assert not bad, "\n".join(bad)


def test_the_domain_imports_nothing_of_the_project() -> None:
    g = project_graph()
    outside = {t for m, ts in g.items() if unit(m) == "domain" for t in ts if unit(t) != "domain"}
    assert not outside, sorted(outside)
