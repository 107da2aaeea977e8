"""The benchmarks' vLLM server command lines (no process started): the block size a bench
asks for appears once, the connector's config only where one is given. (bench-batch and
bench-vllm build their server on bench-peers'; a changed constructor broke both once.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.peers.install import PeerVenv
from bench.vllm.run import BenchServer


def command(kv_transfer_config: dict[str, Any] | None) -> list[str]:
    peer = PeerVenv("vllm", Path("/peers/vllm/bin/python"))
    server = BenchServer(
        peer,
        Path("/model"),
        1 << 30,
        Path("/tmp/vllm.log"),
        4096,
        "0-1",
        block_size=32,
        kv_transfer_config=kv_transfer_config,
    )
    return server.command()


def test_the_block_size_is_given_once_and_the_connector_only_when_configured() -> None:
    plain = command(None)
    assert plain.count("--block-size") == 1
    assert plain[plain.index("--block-size") + 1] == "32"
    assert "--kv-transfer-config" not in plain
    wired = command({"kv_connector": "AttnStoreConnector"})
    assert wired.count("--block-size") == 1
    assert json.loads(wired[wired.index("--kv-transfer-config") + 1]) == {
        "kv_connector": "AttnStoreConnector"
    }
