"""What the scheduler's and the security tests' stacks add to a LocalStack: its daemon and
scheduler by role, and the public-API clients the tests open on it, closed with it."""

from __future__ import annotations

from attnstore.api_client import AttnStoreClient, ClientCredentials
from attnstore.closable import Closable
from attnstore_cli.local_stack import LocalStack
from attnstore_scheduler.launcher import SchedulerProcess
from kvstore_daemon.launcher import DaemonProcess

CLIENT_TIMEOUT_SECONDS = 120  # per call: generous, a loaded test machine is slow


class StackClients(Closable):
    """For a dataclass with the fields `local` and `_clients` (a list, empty at first)."""

    local: LocalStack
    _clients: list[AttnStoreClient]

    @property
    def daemon(self) -> DaemonProcess:
        return self.local.daemon

    @property
    def scheduler(self) -> SchedulerProcess:
        assert self.local.scheduler is not None
        return self.local.scheduler

    def _open_client(
        self, api_key: str | None, credentials: ClientCredentials | None = None
    ) -> AttnStoreClient:
        client = AttnStoreClient(
            self.scheduler.address, api_key, timeout_seconds=CLIENT_TIMEOUT_SECONDS, credentials=credentials
        )
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self.local.stop()
