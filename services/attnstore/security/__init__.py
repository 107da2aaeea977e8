"""Transport security and internal credentials shared by the services: TLS settings of a
server and of an outgoing channel (tls.py), the credentials they load (credentials.py),
and the internal-auth settings of the daemon and the worker (internal_auth.py). The
server interceptor that enforces internal auth is attnstore.server.auth_interceptor."""

from attnstore.security.credentials import (
    ClientCredentials,
    SecurityConfigError,
    aio_channel,
    sync_channel,
)
from attnstore.security.internal_auth import InternalAuth, check_server_security, token_digest
from attnstore.security.tls import ChannelSecurity, ServerTLS

__all__ = [
    "ChannelSecurity",
    "ClientCredentials",
    "InternalAuth",
    "SecurityConfigError",
    "ServerTLS",
    "aio_channel",
    "check_server_security",
    "sync_channel",
    "token_digest",
]
