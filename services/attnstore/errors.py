"""Domain errors shared by the services. They carry no transport detail: the
server edge (attnstore.server.interceptors) maps each kind to a gRPC status."""


class ServiceError(Exception):
    """Base of every error a service reports to its caller; the message is for a person."""


class InvalidArgument(ServiceError):
    """The request is malformed or breaks a configured limit."""


class NotFound(ServiceError):
    """A named thing (namespace, chunk, reservation, session) does not exist."""


class AlreadyExists(ServiceError):
    """The thing exists with different contents."""


class OutOfRange(ServiceError):
    """An index (a layer, an offset) lies outside the valid range."""


class ResourceExhausted(ServiceError):
    """Capacity is full and nothing can be evicted to make room."""


class Overloaded(ResourceExhausted):
    """The server is at a load limit; the caller should retry after `retry_after_ms` (sent
    as the trailing metadata `retry-after-ms`)."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class FailedPrecondition(ServiceError):
    """The system is not in a state that allows the operation."""


class DataLoss(ServiceError):
    """Stored data turned out to be corrupt; it has been dropped."""


class Unavailable(ServiceError):
    """The service is shutting down or a dependency is unreachable; retry later."""


class Unauthenticated(ServiceError):
    """The caller sent no credential, or one the service does not know."""


class PermissionDenied(ServiceError):
    """The caller is known but may not do this (an admin operation)."""
