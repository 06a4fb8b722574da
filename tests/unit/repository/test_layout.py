"""Imports point one way (the design's arrows): no package imports one above it, scheduling
never an implementation, and nothing but pyspark_shuffle imports pyspark; inside
external_shuffle, what both ends share never imports the daemon or the operator tools."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# package -> the packages of this repository it may import
ALLOWED: dict[str, set[str]] = {
    "shuffle_api": set(),
    "shuffle_runtime": {"shuffle_api"},
    "blob": {"shuffle_api", "shuffle_runtime"},
    "scheduling": {"shuffle_api", "shuffle_runtime", "blob"},
    "netty_like": {"shuffle_api", "shuffle_runtime"},
    "external_shuffle": {"shuffle_api", "shuffle_runtime", "scheduling"},
    "pyspark_shuffle": {"shuffle_api", "shuffle_runtime", "scheduling", "blob"},
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


# external_shuffle's parts -> its parts each may import when it runs (type hints aside)
SHARED = {"options", "allocator", "wire"}
EXTERNAL_PARTS: dict[str, set[str]] = {
    "wire": SHARED,
    "client": SHARED | {"client"},
    "ops": SHARED | {"ops", "client"},
    "daemon": SHARED | {"daemon", "ops"},
}


def _parts_imported_when_run(path: Path) -> set[str]:
    """The external_shuffle parts ``path`` imports, leaving out ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hints = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    modules = [
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and id(node) not in hints
    ]
    return {module.split(".")[1] for module in modules if module.startswith("external_shuffle.")}


@pytest.mark.parametrize("part", sorted(EXTERNAL_PARTS))
def test_external_shuffle_parts_import_only_what_they_may(part: str) -> None:
    found = {
        str(path.relative_to(REPO)): wrong
        for path in sorted((REPO / "external_shuffle" / part).rglob("*.py"))
        if (wrong := _parts_imported_when_run(path) - EXTERNAL_PARTS[part])
    }
    assert not found, f"imports against the design: {found}"


def test_external_shuffle_options_import_no_part() -> None:
    assert _parts_imported_when_run(REPO / "external_shuffle" / "options.py") == set()


# pyspark_shuffle's sub-packages -> what each may import of the package (its top-level modules
# are options, the package's catalog of keys, and demo, which nothing imports)
PYSPARK_PARTS: dict[str, set[str]] = {
    "kernels": {"kernels", "options"},
    "spark": {"spark"},
    "tasks": {"tasks", "kernels", "spark", "options"},
    "driver": {"driver", "tasks", "kernels", "spark", "options"},
}


def _pyspark_shuffle_parts(path: Path) -> set[str]:
    modules = [
        node.module or ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.level == 0
    ]
    return {module.split(".")[1] for module in modules if module.startswith("pyspark_shuffle.")}


@pytest.mark.parametrize("part", sorted(PYSPARK_PARTS))
def test_pyspark_shuffle_parts_import_only_what_they_may(part: str) -> None:
    found = {
        str(path.relative_to(REPO)): wrong
        for path in sorted((REPO / "pyspark_shuffle" / part).rglob("*.py"))
        if (wrong := _pyspark_shuffle_parts(path) - PYSPARK_PARTS[part])
    }
    assert not found, f"imports against the design: {found}"


def test_the_kernels_import_no_pyspark() -> None:
    found = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "pyspark_shuffle" / "kernels").rglob("*.py"))
        if "pyspark" in _imported_roots(path)
    ]
    assert not found, f"kernels that import pyspark: {found}"


PACKAGES = frozenset(ALLOWED)


def test_tests_and_benchmarks_import_no_private_module() -> None:
    """The generated wire code is imported through its published modules
    (``external_shuffle.wire.stubs``, ``shuffle_api.messages``), never a ``_private`` one."""
    found: dict[str, list[str]] = {}
    for folder in ("tests", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            private = [
                node.module
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in PACKAGES
                and any(part.startswith("_") for part in node.module.split("."))
            ]
            if private:
                found[str(path.relative_to(REPO))] = private
    assert not found, f"imports of private modules: {found}"


_PATH = re.compile(
    r"(?<![\w.-])(?P<module>(?:" + "|".join(sorted(PACKAGES)) + r")(?:\.\w+)*)"
    r"(?::(?P<object>\w+))?(?![\w-]|\.\w)"
)


def _top_level_names(module: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.ImportFrom | ast.Import):
            targets = node.targets if isinstance(node, ast.Assign) else [node]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.AnnAssign) and isinstance(target.target, ast.Name):
                    names.add(target.target.id)
                elif isinstance(target, ast.ImportFrom | ast.Import):
                    names.update(alias.asname or alias.name for alias in target.names)
    return names


def _named_module(text: str) -> str | None:
    """The project module or object ``text`` names by path (``pkg.mod``, ``pkg.mod.Name``,
    ``pkg.mod:Name``, or an import statement's), if any: a config key such as
    ``scheduling.skew.factor`` names none."""
    for match in _PATH.finditer(text):
        parts = match["module"].split(".")
        for end in range(len(parts), 0, -1):
            base = REPO.joinpath(*parts[:end])
            module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
            if module.is_file():
                rest = [*parts[end:], *([match["object"]] if match["object"] else [])]
                named = len(parts) > 1 or match["object"]
                if named and (not rest or rest[0] in _top_level_names(module)):
                    return match[0]
                break
    return None


def _strings(path: Path) -> list[ast.Constant]:
    """``path``'s string constants, less its docstrings (prose, not names to import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_string_names_a_project_module(package: str) -> None:
    """Implementations are found through pyproject's entry points, processes started from
    imported modules' names: the import graph this file checks is the real one."""
    found = {
        f"{path.relative_to(REPO)}:{node.lineno}": named
        for path in sorted((REPO / package).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        for node in _strings(path)
        if (named := _named_module(str(node.value)))
    }
    assert not found, f"strings that name project modules: {found}"


def test_a_module_path_in_a_string_is_found_and_a_config_key_is_not() -> None:
    assert _named_module("netty_like.NettyShuffleServiceFactory")
    assert _named_module("import sys; from netty_like.host_process import main")
    assert _named_module("external_shuffle.daemon.main")
    assert _named_module("external_shuffle.options:DAEMON_CATALOG")
    assert _named_module("scheduling.skew.factor") is None
    assert _named_module("blob.store-url") is None
    assert _named_module("blob.cache.max-size") is None
    assert _named_module("netty_like") is None  # a service's entry point name


def test_no_two_public_classes_share_a_name() -> None:
    """A class's name says its role: two services' settings are not both ``GateSettings``."""
    places: dict[str, list[str]] = {}
    for package in sorted(ALLOWED):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    places.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in places.items() if len(paths) > 1}
    assert not shared, f"classes of one name: {shared}"
