"""CHANGELOG.md's compatibility statement names the versions this pyshuffle writes."""

from __future__ import annotations

from pathlib import Path

from external_shuffle.wire.version import WIRE_VERSION
from shuffle_api import serialization
from shuffle_runtime import format as partition_format

ROOT = Path(__file__).resolve().parents[3]


def _compatibility() -> str:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    section = text.split("\n## Compatibility\n", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())  # one line: the prose wraps anywhere


def test_compatibility_names_the_descriptor_and_manifest_formats_written() -> None:
    section = _compatibility()
    assert f"descriptor envelopes (format {serialization.FORMAT_VERSION})" in section
    assert f"partition manifests on the stores (format {partition_format.FORMAT_VERSION}," in (
        section
    )


def test_compatibility_names_the_grpc_api_version() -> None:
    protos = sorted(path.parent.name for path in (ROOT / "proto" / "pyshuffle").glob("*/*.proto"))
    (api,) = set(protos)
    assert f"The gRPC API is `pyshuffle.{api}`" in _compatibility()


def test_compatibility_names_the_wire_version_spoken() -> None:
    assert f"`pyshuffle-wire` header (version {WIRE_VERSION};" in _compatibility()
