"""Generate the Python protobuf modules from proto/ (the one way they are made).

Usage: python scripts/generate_proto.py [--out DIR]

With --out, the modules are written under DIR instead of the repository (the freshness test
compares the two). Each .proto maps to one package's private ``_proto`` folder.
"""

from __future__ import annotations

import argparse
import shutil
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
}


def generate(out_root: Path) -> list[Path]:
    """Generate every target under ``out_root``; return the files written."""
    written: list[Path] = []
    for proto, package_dir in TARGETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            status = protoc.main(
                [
                    "grpc_tools.protoc",
                    f"-I{PROTO_ROOT}",
                    f"--python_out={tmp}",
                    f"--pyi_out={tmp}",
                    str(PROTO_ROOT / proto),
                ]
            )
            if status != 0:
                raise SystemExit(f"protoc failed on {proto} (exit {status})")
            target = out_root / package_dir
            target.mkdir(parents=True, exist_ok=True)
            stem = Path(proto).stem
            for suffix in ("_pb2.py", "_pb2.pyi"):
                source = Path(tmp) / Path(proto).parent / f"{stem}{suffix}"
                shutil.copyfile(source, target / source.name)
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
