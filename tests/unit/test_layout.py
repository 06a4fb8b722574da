"""Imports point one way (the design's arrows): no package imports one above it, scheduling
never an implementation, and nothing but pyspark_shuffle imports pyspark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# package -> the packages of this repository it may import
ALLOWED: dict[str, set[str]] = {
    "shuffle_api": set(),
    "blob": {"shuffle_api"},
    "scheduling": {"shuffle_api", "blob"},
    "netty_like": {"shuffle_api"},
    "external_shuffle": {"shuffle_api", "scheduling"},
    "pyspark_shuffle": {"shuffle_api", "scheduling", "blob"},
}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_the_design_allows(package: str) -> None:
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        roots = _imported_roots(path) & set(ALLOWED) - {package}
        wrong = roots - ALLOWED[package]
        if "pyspark" in _imported_roots(path) and package != "pyspark_shuffle":
            wrong.add("pyspark")
        if wrong:
            found[str(path.relative_to(REPO))] = wrong
    assert not found, f"imports against the design: {found}"
