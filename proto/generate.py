"""Generates the Python gRPC stubs from proto/ into services/ (run by `make proto`).

The stubs are committed; tests/unit/test_generated_stubs.py fails when they are stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = PROTO_ROOT.parent / "services"
_SERVICE = re.compile(r"^service \w+", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Writes *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    for proto in proto_files():
        rel = proto.relative_to(PROTO_ROOT)
        # A file of shared types only (common.proto) gets no *_pb2_grpc.py: it would be empty.
        grpc_out = [f"--grpc_python_out={out_dir}"] if _SERVICE.search(proto.read_text()) else []
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                *grpc_out,
                str(rel),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {rel}")
        # Packages need an __init__.py so setuptools ships them.
        for parent in (out_dir / rel).parents:
            if parent == out_dir:
                break
            (parent / "__init__.py").touch()
    return sorted(p for p in out_dir.rglob("*_pb2*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output root")
    args = parser.parse_args()
    written = generate(args.out)
    print(f"generated {len(written)} files under {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
