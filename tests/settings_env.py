"""Loading a service's settings the way it starts (attnstore.settings.load_settings): from a
TOML config file and environment variables, named with the settings class's own prefix."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import pytest
from pydantic_settings import BaseSettings

from attnstore.settings import SettingsError, load_settings

S = TypeVar("S", bound=BaseSettings)


def loaded(
    settings_class: type[S], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, toml: str, **env: str
) -> S:
    """`settings_class` from a config file holding `toml`, overridden by `env` (names
    without the prefix, e.g. CHUNK_TOKENS)."""
    prefix = settings_class.model_config.get("env_prefix", "")
    config = tmp_path / "service.toml"
    config.write_text(toml)
    monkeypatch.setenv(f"{prefix}CONFIG_FILE", str(config))
    set_env(settings_class, monkeypatch, env)
    return load_settings(settings_class)


def refusal(settings_class: type[BaseSettings], monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    """The SettingsError message `settings_class` must refuse `env` with (names without
    the prefix)."""
    set_env(settings_class, monkeypatch, env)
    with pytest.raises(SettingsError) as error:
        load_settings(settings_class)
    return str(error.value)


def set_env(settings_class: type[BaseSettings], monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    prefix = settings_class.model_config.get("env_prefix", "")
    for name, value in env.items():
        monkeypatch.setenv(f"{prefix}{name}", value)


def undocumented(settings_class: type[BaseSettings]) -> list[str]:
    """Settings whose variable the README's configuration tables do not name."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    prefix = settings_class.model_config.get("env_prefix", "")
    return [name for name in settings_class.model_fields if f"{prefix}{name.upper()}" not in readme]
