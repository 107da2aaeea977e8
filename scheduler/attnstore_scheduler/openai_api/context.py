"""What the HTTP routes share with the gRPC API: the turn path, sessions, the workers'
model, the callers' gate (API keys, per-tenant rate) and the API limits (one of each per
scheduler)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from attnstore_scheduler.callers import Callers
from attnstore_scheduler.openai_api.errors import ApiError
from attnstore_scheduler.sessions import Sessions
from attnstore_scheduler.turns import Turns
from attnstore_scheduler.validation import ApiLimits, require_model
from attnstore_scheduler.worker_registry import WorkerRegistry


@dataclass(frozen=True)
class ApiContext:
    turns: Turns
    sessions: Sessions
    registry: WorkerRegistry
    callers: Callers
    limits: ApiLimits

    def tenant(self, request: Request) -> str:
        """The caller's tenant (`Authorization: Bearer <key>` or `x-api-key`), one call
        taken from its rate."""
        return self.callers.admit(list(request.headers.items())).tenant

    def model_name(self) -> str:
        """The served model's name (its directory's name); 503 before a worker registered."""
        return require_model(self.registry.model()).model_label

    def check_model(self, requested: str) -> str:
        served = self.model_name()
        if requested != served:
            raise ApiError(
                404,
                f"the model {requested[:100]!r} does not exist; this server serves {served!r} (GET /v1/models)",
                "invalid_request_error",
                "model_not_found",
                param="model",
            )
        return served
