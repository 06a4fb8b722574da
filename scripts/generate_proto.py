"""Generate the Python protobuf modules from proto/ (the one way they are made).

Usage: python scripts/generate_proto.py [--out DIR]

With --out, the modules are written under DIR instead of the repository (the freshness test
compares the two). Each .proto maps to one package's private ``_proto`` folder; protos with
services also get their gRPC stubs (``*_pb2_grpc.py``), which import their messages relatively.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"

# proto file (relative to proto/) -> package folder that owns its generated module
TARGETS: dict[str, str] = {
    "pyshuffle/v1/descriptors.proto": "shuffle_api/_proto",
    "pyshuffle/v1/netty_like.proto": "netty_like/_proto",
    "pyshuffle/v1/external_shuffle.proto": "external_shuffle/wire/_proto",
}
WITH_SERVICES = frozenset({"pyshuffle/v1/external_shuffle.proto"})


def generate(out_root: Path) -> list[Path]:
    """Generate every target under ``out_root``; return the files written."""
    written: list[Path] = []
    for proto, package_dir in TARGETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            services = [f"--grpc_python_out={tmp}"] if proto in WITH_SERVICES else []
            status = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{PROTO_ROOT}",
                    f"--python_out={tmp}",
                    f"--pyi_out={tmp}",
                    *services,
                    str(PROTO_ROOT / proto),
                ]
            )
            if status != 0:
                raise SystemExit(f"protoc failed on {proto} (exit {status})")
            target = out_root / package_dir
            target.mkdir(parents=True, exist_ok=True)
            stem = Path(proto).stem
            suffixes = ("_pb2.py", "_pb2.pyi", *(("_pb2_grpc.py",) if services else ()))
            for suffix in suffixes:
                source = Path(tmp) / Path(proto).parent / f"{stem}{suffix}"
                text = source.read_text()
                # The stubs import their messages by proto path; here they sit side by side.
                package = ".".join(Path(proto).parent.parts)
                text = text.replace(
                    f"from {package} import {stem}_pb2", f"from . import {stem}_pb2"
                )
                (target / source.name).write_text(text)
                written.append(target / source.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write the modules under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
