"""The layers import only downward: ``hoprl`` (the library) <- ``services`` <- ``flows`` <- ``cli``.

Every module's imports are read statically (``ast``: ``import x``, ``from x import y``, relative
imports, and imports inside functions), so nothing is imported and a violation names the file and
the module it imports. The rules:

- ``hoprl/`` imports nothing from ``services``, ``flows``, ``cli`` or ``bench``;
- ``services/`` imports nothing from ``flows``, ``cli`` or ``bench``, and no service imports
  another (``services/<a>/`` never imports ``services.<b>``; the shared modules ``services/*.py``
  are everyone's);
- ``flows/`` imports nothing from ``cli`` or ``bench``, nor from ``services`` (the flows reach the
  services through the clients in ``hoprl.clients``);
- ``cli/`` and ``bench/`` sit on top and may import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: top-level package -> the top-level packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "hoprl": frozenset({"services", "flows", "cli", "bench"}),
    "services": frozenset({"flows", "cli", "bench"}),
    "flows": frozenset({"services", "cli", "bench"}),
}

#: (importing module, imported module) pairs allowed to cross a rule: none. Since 2026-11-25
#: generation (hoprl/generation/) and the training algorithms (hoprl/training/) are in the
#: library, so the trainer and the pipeline flow no longer reach into the policy service. Nothing
#: may be added here.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """``name`` is a module or package of this repository (not a class or function in one)."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, at any depth of the code.

    ``from a.b import c`` is ``a.b``, and ``a.b.c`` too when ``c`` is a module of the repository;
    a relative import is resolved against ``module`` (its own package when ``is_package``).
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if base:
                found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}".strip(".")))
    return {name.strip(".") for name in found}


@cache
def graph() -> dict[str, set[str]]:
    """module -> the modules it imports, for every module of the layered packages."""
    out: dict[str, set[str]] = {}
    for package in ("hoprl", "services", "flows", "cli", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = module_name(path)
            out[name] = imports_of(path.read_text(), name, path.name == "__init__.py")
    return out


def crossings() -> Iterator[tuple[str, str, str]]:
    """(module, imported module, the rule it breaks) for every import that crosses a layer."""
    services = {p.name for p in (ROOT / "services").iterdir() if (p / "__init__.py").is_file()}
    for module, imported in graph().items():
        layer = module.split(".")[0]
        for target in sorted(imported):
            top = target.split(".")[0]
            if top in FORBIDDEN.get(layer, ()):
                yield module, target, f"{layer}/ must not import {top}"
            own, parts = module.split("."), target.split(".")
            # inside a service's package (not one of the shared services/*.py), into another one
            source = own[1] if layer == "services" and len(own) > 1 and own[1] in services else None
            other = parts[1] if top == "services" and len(parts) > 1 and parts[1] in services else None
            if source and other and other != source:
                yield module, target, f"services/{source} must not import another service"


def test_the_packages_are_found() -> None:
    """The walk sees the code it guards (a moved or renamed folder would make the checks vacuous)."""
    names = graph()
    for module in ("hoprl.schemas", "hoprl.clients.trainer", "services.policy.app", "flows.pipeline"):
        assert module in names, module
    assert "cli.main" in names and "bench.train" in names
    assert "hoprl.schemas.trainer" in names["services.trainer.routes"]


def test_imports_inside_functions_and_relative_imports_count() -> None:
    source = "import os\ndef f():\n    from services.policy import streaming\n    from .x import y\n"
    assert imports_of(source, "hoprl.clients.trainer") == {
        "os",
        "services.policy",
        "services.policy.streaming",
        "hoprl.clients.x",
    }
    assert imports_of("from . import http", "hoprl.clients", is_package=True) == {
        "hoprl.clients",
        "hoprl.clients.http",
    }


@pytest.mark.parametrize("layer", ["hoprl", "services", "flows"])
def test_each_layer_imports_only_downward(layer: str) -> None:
    bad = [
        f"{module} imports {target}: {rule}"
        for module, target, rule in crossings()
        if module.split(".")[0] == layer and (module, target) not in ALLOWED
    ]
    assert not bad, "\n".join(bad)


def test_the_allow_list_only_shrinks() -> None:
    """Every allowed crossing still exists: once phase B removes an import, its entry goes too."""
    present = {(module, target) for module, target, _ in crossings()}
    assert not ALLOWED - present, f"remove from ALLOWED: {sorted(ALLOWED - present)}"
