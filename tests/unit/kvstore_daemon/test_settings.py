from pathlib import Path

import pytest
from settings_env import loaded, refusal, undocumented

from attnstore.settings import SettingsError, load_settings
from kvstore_daemon.settings import DaemonSettings


def test_environment_overrides_the_toml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = 'eviction_policy = "fifo"\ndram_capacity_bytes = 268435456\nssd_dirs = ["/a", "/b"]\n'
    settings = loaded(DaemonSettings, monkeypatch, tmp_path, toml, EVICTION_POLICY="lru")
    assert settings.eviction_policy == "lru"
    assert settings.dram_capacity_bytes == 256 * 1024 * 1024
    assert settings.ssd_dirs == [Path("/a"), Path("/b")]


def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    message = refusal(DaemonSettings, monkeypatch, EVICTION_POLICY="random", DRAM_CAPACITY_BYTES="lots")
    assert "ATTNSTORE_DAEMON_EVICTION_POLICY" in message and "'random'" in message
    assert "ATTNSTORE_DAEMON_DRAM_CAPACITY_BYTES" in message


def test_inconsistent_watermarks_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSTORE_DAEMON_DRAM_LOW_WATERMARK", "0.99")
    monkeypatch.setenv("ATTNSTORE_DAEMON_DRAM_HIGH_WATERMARK", "0.9")
    with pytest.raises(SettingsError, match="dram_low_watermark"):
        load_settings(DaemonSettings)


def test_missing_config_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ATTNSTORE_DAEMON_CONFIG_FILE", str(tmp_path / "absent.toml"))
    with pytest.raises(SettingsError, match="no such file"):
        load_settings(DaemonSettings)


def test_readme_documents_every_setting() -> None:
    missing = undocumented(DaemonSettings)
    assert not missing, f"README's configuration table lacks {missing}"
