"""What is generated is fresh: the protobuf modules and gRPC stubs are exactly what
scripts/generate_proto.py makes from proto/, and the option tables of docs/configuration.md
what scripts/generate_config_docs.py makes from the options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_protobuf_modules_are_fresh(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_proto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    generated = sorted(line for line in completed.stdout.splitlines() if line)
    assert generated, "the generator wrote nothing"
    stale = [
        relative
        for relative in generated
        if (tmp_path / relative).read_bytes() != (ROOT / relative).read_bytes()
    ]
    assert not stale, f"regenerate with `make proto`: {stale}"
    checked_in = sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("**/_proto/*_pb2*.py*"))
    assert checked_in == generated, "a generated module has no .proto source (or the reverse)"


def test_the_configuration_page_lists_every_option_as_it_is() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_config_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    page = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("external-shuffle.coordinator.status-port", "pyspark-shuffle.reducer.min-count"):
        assert f"| `{key}` |" in page
