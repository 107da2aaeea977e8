"""vLLM's kv_transfer_config for the connector, built from validated settings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnstore_vllm.settings import ConnectorSettings, kv_transfer_config


def test_names_the_connector_and_carries_only_the_settings_given() -> None:
    config = kv_transfer_config(ConnectorSettings(daemon="127.0.0.1:50051", chunk_tokens=64))
    assert config == {
        "kv_connector": "AttnStoreConnector",
        "kv_connector_module_path": "attnstore_vllm.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"daemon": "127.0.0.1:50051", "chunk_tokens": 64},
    }
    assert ConnectorSettings.from_extra_config(config["kv_connector_extra_config"]).chunk_tokens == 64


def test_the_named_module_defines_the_named_class() -> None:
    """Checked without importing it (that would import vLLM)."""
    config = kv_transfer_config(ConnectorSettings(daemon="127.0.0.1:50051"))
    spec = importlib.util.find_spec(config["kv_connector_module_path"])
    assert spec is not None and spec.origin is not None
    assert f"class {config['kv_connector']}(" in Path(spec.origin).read_text()
