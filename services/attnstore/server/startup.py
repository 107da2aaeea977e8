"""What each service's main() does before it runs: settings, logging, the allocator. The
daemon, worker and scheduler share it, then run their coroutine with
attnstore.settings.run_or_exit."""

from __future__ import annotations

from typing import TypeVar

import structlog

from attnstore.server.allocator import keep_large_buffers
from attnstore.server.logging import configure_logging
from attnstore.server.service_settings import ServiceSettings
from attnstore.settings import load_settings_or_exit

S = TypeVar("S", bound=ServiceSettings)

log = structlog.get_logger("attnstore.server.startup")


def start_service(settings_cls: type[S], program: str, *, large_buffers: bool = False) -> S:
    """The service's settings (or their problems on stderr and exit 2), logging as they say,
    and with `large_buffers` glibc's malloc kept from unmapping multi-MB buffers (allocator.py)."""
    settings = load_settings_or_exit(settings_cls, program)
    configure_logging(settings.log_level, settings.log_json)
    if large_buffers and not keep_large_buffers():
        log.info("allocator_not_tuned", reason="not glibc")
    return settings
