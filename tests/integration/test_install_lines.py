"""Every line of README.md, docs/ and deploy/ that tells a user to install pyshuffle, run as
written: the wheel built by the documented ``pip wheel`` line in a copy of this checkout, then
each install line in a fresh virtual environment, whose ``pyshuffle`` and extras must work.
(docs/pyspark.md's recipe is run whole by test_install_recipe.py; the Containerfiles install
from the checkout they copy.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.source_tree import ROOT, copy_source

DOCUMENTS = (
    "README.md",
    *(str(path.relative_to(ROOT)) for path in sorted((ROOT / "docs").glob("*.md"))),
    "deploy/README.md",
    "deploy/pyshuffle-daemon.service",
    "deploy/spark-defaults.conf",
    "deploy/local-cluster.sh",
)
# `pip install ...` up to the end of its line or of its `code span`.
INSTALL = re.compile(r"(?P<pip>[\w./-]*pip) install (?P<arguments>[^`\n]+)")
WHEEL_LINE = re.compile(r"(?:python3 -m )?pip wheel --no-deps --wheel-dir dist \.")
NAMED_WHEEL = '"$(ls dist/pyshuffle-*.whl)['
# pyshuffle by name, an extra or its wheel (not a path that starts with the name).
PYSHUFFLE = re.compile(r"\bpyshuffle(?:\[|-\*\.whl|[\"'\s]|$)")
# What each extra must bring, as an import in the new environment.
EXTRA_IMPORTS = {
    "spark": "import pandas, pyspark; from pyspark_shuffle import SparkShuffle, enable",
    "external": "import grpc, external_shuffle.daemon.main",
    "connect": "import pyspark.sql.connect.session",
    "s3": "import s3fs",
}


def documented_installs() -> dict[str, list[str]]:
    """Each distinct install line of pyshuffle (its pip as ``pip``) -> the documents it is in."""
    found: dict[str, list[str]] = {}
    for document in DOCUMENTS:
        for match in INSTALL.finditer((ROOT / document).read_text(encoding="utf-8")):
            arguments = match["arguments"].strip().rstrip(".;")
            if PYSHUFFLE.search(arguments):
                found.setdefault(f"pip install {arguments}", []).append(document)
    return found


def test_every_install_line_names_the_wheel_the_docs_build() -> None:
    installs = documented_installs()
    assert installs, "no install line found: has the wording changed?"
    for line, documents in installs.items():
        # pyshuffle is on no package index: `pip install "pyshuffle[...]"` fails as written.
        assert NAMED_WHEEL in line, f"{line!r} in {documents} does not name the built wheel"
    for document in {d for documents in installs.values() for d in documents}:
        text = (ROOT / document).read_text(encoding="utf-8")
        if "README" in document:  # the files say where the wheel comes from, by line or link
            assert WHEEL_LINE.search(text) or "README.md#install" in text, document


def _extras(line: str) -> list[str]:
    found = re.search(re.escape(NAMED_WHEEL) + r"([\w,]+)\]", line)
    assert found, line
    return found.group(1).split(",")


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("line", sorted(documented_installs()))
def test_an_install_line_as_written_gives_a_working_pyshuffle(
    line: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    checkout = _built_checkout(tmp_path_factory)
    environment = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    installed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line.replace("pip", f"{environment}/bin/pip", 1)],
        cwd=checkout,
        env=_shell_environment(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-4000:]
    version = subprocess.run(
        [str(environment / "bin" / "pyshuffle"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert version.returncode == 0 and version.stdout.startswith("pyshuffle "), version
    assert "unknown" not in version.stdout  # the installed distribution's own version
    for extra in _extras(line):
        imported = subprocess.run(
            [str(python), "-c", EXTRA_IMPORTS[extra]],
            cwd=environment,  # nothing of the checkout on the path
            capture_output=True,
            text=True,
            check=False,
        )
        assert imported.returncode == 0, f"[{extra}]: {imported.stderr[-2000:]}"


def _shell_environment() -> dict[str, str]:
    """A user's shell with this interpreter's pip and python3 first on the path."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTHON", "VIRTUAL_ENV", "PYSHUFFLE_"))
    }
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    return environment


def _built_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout with dist/ built by the documented line (once a process)."""
    checkout = tmp_path_factory.getbasetemp() / "install-lines-checkout"
    if not (checkout / "dist").is_dir():
        copy_source(checkout)
        wheel_line = WHEEL_LINE.search((ROOT / "README.md").read_text(encoding="utf-8"))
        assert wheel_line, "README.md's Install has no `pip wheel` line"
        subprocess.run(
            ["bash", "-euo", "pipefail", "-c", wheel_line.group(0)],
            cwd=checkout,
            env=_shell_environment(),
            check=True,
            capture_output=True,
            timeout=600,
        )
    return checkout
