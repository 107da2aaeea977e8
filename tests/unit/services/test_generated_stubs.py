"""The committed gRPC stubs must match what `make proto` generates from proto/."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in generate.generate(tmp_path)}
    assert fresh, "no stubs were generated"
    stale = [str(rel) for rel, data in fresh.items() if (ROOT / "services" / rel).read_bytes() != data]
    assert not stale, f"stale gRPC stubs (run `make proto`): {stale}"
    committed = {p.relative_to(ROOT / "services") for p in (ROOT / "services").rglob("*_pb2*.py*")}
    assert committed == set(fresh), "committed stubs without a .proto (or missing ones)"
