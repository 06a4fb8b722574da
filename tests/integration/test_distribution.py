"""The distribution as pip builds it from this checkout: what its wheel ships."""

from __future__ import annotations

import email
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from email.message import Message

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


def _metadata(wheel: zipfile.ZipFile) -> Message:
    (path,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(path))


def test_the_license_is_an_spdx_expression_with_its_file(wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License"] is None  # the deprecated free-text field
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in wheel.namelist())


def test_the_classifiers_say_typed_and_start_at_the_oldest_python(wheel: zipfile.ZipFile) -> None:
    metadata = _metadata(wheel)
    classifiers = metadata.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it
    pythons = sorted(
        tuple(map(int, c.rsplit(" ", 1)[1].split(".")))
        for c in classifiers
        if c.startswith("Programming Language :: Python :: 3.")
    )
    oldest = metadata["Requires-Python"].removeprefix(">=")
    assert pythons and pythons[0] == tuple(map(int, oldest.split("."))), (pythons, oldest)
