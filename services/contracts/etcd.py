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


LOGIN_TIMEOUT_S = 30.0
"""How long a login may take. A login is a TLS handshake and a bcrypt compare on the member:
about 90 ms here when idle, 1.4-2 s with etcd at a twentieth of a core (a restart among JVMs
starting on a loaded 2-core machine). Under a poll's own 1 s deadline such a login was abandoned
and asked again a second later, and never finished: every workload kept its last good view and
`likes flags` timed out, minutes after etcd was back (CI, 2026-12-06). And after a restart every
workload logs in at once: ~10 bcrypts side by side on a starved member can outlast 10 s, and a
login that timed out is asked again, one bcrypt more for the member (CI's starved-etcd flags test
failed at the CLI's 10 s login, then again with only the workloads' login left at 10 s). One
bound for every caller, workload or CLI: a login under way costs nothing to wait for. Polls stay
short; only the login gets this long."""


class Client(aetcd.Client):
    """aetcd's client with its `connect` replaced: over TLS when `ca_file` names the CA (aetcd
    1.0.0, the newest release, dials only insecure channels), and one login at a time under
    LOGIN_TIMEOUT_S, not the per-call timeout. The login runs as its own task: a caller whose
    deadline passes stops waiting, the login goes on, and the next call waits for that same
    login instead of starting another. The rest is aetcd's own, step for step (stubs, watcher)."""

    def __init__(
        self, *args: Any, ca_file: str | None = None, login_timeout: float = LOGIN_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self._tls = (
            grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
            if ca_file
            else None
        )
        self.login_timeout = login_timeout
        self._login: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._login is None or self._login.done():  # none yet, or the last one failed
            self._login = asyncio.ensure_future(self._open())
        login = self._login
        try:
            await asyncio.shield(login)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if login.cancelled() and task is not None and not task.cancelling():
                # the client was closed under this caller, which was not itself cancelled: an
                # error it handles as any other, not a cancellation that would end its task
                raise aetcd_exceptions.ConnectionFailedError("closed while logging in") from None
            raise

    async def _open(self) -> None:
        target = f"{self._host}:{self._port}"
        options = self._options.items()
        channel = (
            rpc.secure_channel(target, self._tls, options=options)
            if self._tls is not None
            else rpc.insecure_channel(target, options=options)
        )
        metadata = None
        # a failed login leaves its channel to the garbage collector, as aetcd does: awaiting
        # grpc's close there hung a cancelled login, and asyncio.run's exit with it (CI, 600 s)
        if self._username is not None and self._password is not None:
            req = rpc.AuthenticateRequest(name=self._username, password=self._password)
            try:
                resp = await rpc.AuthStub(channel).Authenticate(req, timeout=self.login_timeout)
            except rpc.AioRpcError as e:
                aetcd_exceptions._handle_exception(e)  # raises aetcd's own error type
                raise
            metadata = (("token", resp.token),)
        self.channel, self.metadata = channel, metadata
        self.auth_stub = rpc.AuthStub(channel)
        self.kvstub = rpc.KVStub(channel)
        self.clusterstub = rpc.ClusterStub(channel)
        self.leasestub = rpc.LeaseStub(channel)
        self.maintenancestub = rpc.MaintenanceStub(channel)
        self._watcher = aetcd_watcher.Watcher(
            rpc.WatchStub(channel), timeout=self._timeout, metadata=metadata
        )
        self._connected.set()

    async def close(self) -> None:
        login, self._login = self._login, None
        if login is not None and not login.done():
            login.cancel()
            await asyncio.wait({login}, timeout=STOP_WAIT_S)
        await super().close()


def client(
    host: str,
    port: int,
    creds: Credentials | None,
    timeout: float,
    ca_file: str | None = None,
) -> Client:
    """A client that logs in on connect (over TLS when `ca_file` names the platform's CA); each
    call's deadline is `timeout`, the login's LOGIN_TIMEOUT_S. etcd drops its token when the
    user's password is rewritten (the auth Job rotating it) and after 5 idle minutes: every
    caller drops its client on an error and connects again, which logs in anew."""
    return Client(
        host=host,
        port=port,
        username=creds.user if creds else None,
        password=creds.password if creds else None,
        timeout=timeout,  # aetcd annotates int; grpc takes a float
        ca_file=ca_file,
    )


async def connected(c: aetcd.Client) -> aetcd.Client:
    """`c`, logged in: wait up to its login timeout (LOGIN_TIMEOUT_S unless it was made with
    another) for its login, then each call has its own (short) deadline. A poller calls this
    before the call it times."""
    await asyncio.wait_for(c.connect(), getattr(c, "login_timeout", LOGIN_TIMEOUT_S))
    return c


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
        settings.etcd_host, settings.etcd_port, credentials(settings), timeout,
        settings.tls_ca_file,
    )  # fmt: skip
