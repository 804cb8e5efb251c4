"""etcd access: the user every workload logs in as, the Secrets that hold the passwords, and the
one client factory (aetcd). Light on purpose: the `likes` CLI imports it, so no other store's
driver comes with it.

etcd runs with authentication on (services/schema/etcd_auth.py turns it on): a client without
credentials, or with wrong ones, is refused.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import exceptions as aetcd_exceptions
from aetcd import rpc
from aetcd import watcher as aetcd_watcher

from services.contracts import keys
from services.contracts.logins import Credentials as Credentials
from services.contracts.settings import Settings

SERVICE_USER = "likes"  # every workload; its role may read and write keys.ETCD_PREFIX only
SERVICE_ROLE = "likes"
PREFIX = keys.ETCD_PREFIX
ROOT_USER = "root"  # etcd requires it to enable auth; only the bootstrap logs in as root

# Kubernetes Secrets (played locally by the stack's secrets file), key PASSWORD_KEY in each
AUTH_SECRET = "etcd-auth"  # SERVICE_USER's password: the workloads' namespace and the data one
ROOT_SECRET = "etcd-root"  # ROOT_USER's password: the data namespace only (the bootstrap Job)
PASSWORD_KEY = "password"


def credentials(settings: Settings) -> Credentials | None:
    """The settings' etcd login; None when they name no user (a test against a bare server)."""
    if settings.etcd_user is None or settings.etcd_password is None:
        return None
    return Credentials(settings.etcd_user, settings.etcd_password.get_secret_value())


class TlsClient(aetcd.Client):
    """aetcd 1.0.0 (the newest release) dials only insecure channels. This is its `connect`
    with the channel opened over TLS (verified against `ca_file`, the server's name included);
    the rest is aetcd's own, step for step (login, stubs, watcher)."""

    def __init__(self, *args: Any, ca_file: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tls = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(target, self._tls, options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                req = rpc.AuthenticateRequest(name=self._username, password=self._password)
                try:
                    resp = await self.auth_stub.Authenticate(req, timeout=self._timeout)
                except rpc.AioRpcError as e:
                    aetcd_exceptions._handle_exception(e)  # raises aetcd's own error type
                    raise
                self.metadata = (("token", resp.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd_watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def client(
    host: str,
    port: int,
    creds: Credentials | None,
    timeout: float,
    ca_file: str | None = None,
) -> aetcd.Client:
    """A client that logs in on connect (over TLS when `ca_file` names the platform's CA). etcd
    drops its token when the user's password is rewritten (the auth Job rotating it) and after
    5 idle minutes: every caller drops its client on an error and connects again, which logs in
    anew."""
    kwargs: dict[str, Any] = {
        "host": host,
        "port": port,
        "username": creds.user if creds else None,
        "password": creds.password if creds else None,
        "timeout": timeout,  # aetcd annotates int; grpc takes a float
    }
    if ca_file:
        return TlsClient(**kwargs, ca_file=ca_file)
    return aetcd.Client(**kwargs)


STOP_WAIT_S = 5.0  # a shutdown waits this long at most for a poll to end, and for a close


async def stop_poller(
    task: asyncio.Task[None] | None,
    client: aetcd.Client | None,
    wait_s: float = STOP_WAIT_S,
) -> None:
    """Stop a task that polls etcd and close its client, waiting at most `wait_s` for each.

    A shutdown must not hang on etcd: a write service's shutdown once waited forever here (its
    poll cancelled, then the grpc call or the channel's close never returning, after a test had
    restarted the stores around it). What does not end in time is left to the process's exit."""
    if task is not None:
        task.cancel()
        await asyncio.wait({task}, timeout=wait_s)
    if client is None:
        return
    closing = asyncio.ensure_future(client.close())
    done, _ = await asyncio.wait({closing}, timeout=wait_s)
    if not done:
        logging.getLogger("etcd").warning("etcd client did not close in %.1f s; left", wait_s)
    elif not closing.cancelled():
        closing.exception()  # retrieved, not raised: a broken channel is gone either way


def from_settings(settings: Settings, timeout: float) -> aetcd.Client:
    return client(
        settings.etcd_host, settings.etcd_port, credentials(settings), timeout, settings.tls_ca_file
    )
