"""The distribution as pip builds it from this checkout: what its wheel ships."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator

import pytest

from tests.source_tree import ROOT, copy_source

pytestmark = pytest.mark.slow  # a build in an isolated environment: seconds at best

PACKAGES = sorted(
    pattern.removesuffix("*")
    for pattern in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
)
"""The top-level packages the distribution ships, as pyproject.toml finds them."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    work = tmp_path_factory.mktemp("wheel")
    source = copy_source(work / "source")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", "dist", str(source)],
        cwd=work,
        check=True,
        timeout=600,
    )
    (built,) = (work / "dist").glob("pyshuffle-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_every_package_ships_a_py_typed_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert PACKAGES, "pyproject.toml finds no package"
    missing = [package for package in PACKAGES if f"{package}/py.typed" not in names]
    assert not missing, f"no py.typed in the wheel for {missing}"
