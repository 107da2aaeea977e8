"""Loading service settings: environment variables over an optional TOML file,
validated at start with messages a person understands. A nested setting (a TLS block)
is one JSON variable or one variable per field: `<PREFIX>TLS__CERT_FILE`."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


class SettingsError(Exception):
    """Settings failed validation; the message lists every problem."""


class FileBackedSettings(BaseSettings):
    """Environment variables win over the TOML file named by `<PREFIX>CONFIG_FILE`."""

    model_config = SettingsConfigDict(env_nested_delimiter="__")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(config_file_variable(settings_cls))
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)


def config_file_variable(settings_cls: type[BaseSettings]) -> str:
    return f"{settings_cls.model_config.get('env_prefix', '')}CONFIG_FILE"


def load_settings(settings_cls: type[SettingsT]) -> SettingsT:
    """Builds the settings or raises SettingsError naming each bad variable."""
    prefix = settings_cls.model_config.get("env_prefix", "")
    config_file = os.environ.get(config_file_variable(settings_cls))
    if config_file and not Path(config_file).is_file():
        raise SettingsError(f"{config_file_variable(settings_cls)}={config_file}: no such file")
    try:
        return settings_cls()
    except ValidationError as exc:
        lines = [f"invalid {settings_cls.__name__} ({exc.error_count()} problem(s)):"]
        for error in exc.errors():
            lines.append(f"  {_variable(prefix, error['loc'])}: {error['msg']} (got {error.get('input')!r})")
        raise SettingsError("\n".join(lines)) from exc


def _variable(prefix: str, loc: tuple[int | str, ...]) -> str:
    """The variable an error is about: tls.cert_file is <PREFIX>TLS__CERT_FILE; what is
    inside a list (nodes.0.name) stays within its JSON variable; none for a cross-field check."""
    if not loc:
        return "settings"
    names = list(itertools.takewhile(lambda part: isinstance(part, str), loc))
    inside = ".".join(str(part) for part in loc[len(names) :])
    variable = f"{prefix}{'__'.join(names)}".upper()
    return f"{variable}.{inside}" if inside else variable


def load_settings_or_exit(settings_cls: type[SettingsT], program: str) -> SettingsT:
    """A service's start: its settings, or the problems on stderr and exit status 2."""
    try:
        return load_settings(settings_cls)
    except SettingsError as exc:
        exit_on_startup_error(program, exc)


def exit_on_startup_error(program: str, error: Exception) -> NoReturn:
    """A start that cannot succeed (bad settings, model, arena...): say why and exit 2."""
    print(f"{program}: {error}", file=sys.stderr)
    raise SystemExit(2) from error


def run_or_exit(
    program: str,
    run: Callable[[Coroutine[Any, Any, None]], object],
    service: Coroutine[Any, Any, None],
    startup_errors: tuple[type[Exception], ...],
) -> None:
    """Runs a service's main coroutine with `run` (asyncio.run, uvloop.run); one of
    `startup_errors` (a start that cannot succeed) exits as exit_on_startup_error does."""
    try:
        run(service)
    except startup_errors as exc:
        exit_on_startup_error(program, exc)
