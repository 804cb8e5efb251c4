"""etcd access: the user every workload logs in as, the Secrets that hold the passwords, and the
one client factory (aetcd). Light on purpose: the `likes` CLI imports it, so no other store's
driver comes with it.

etcd runs with authentication on (services/schema/etcd_auth.py turns it on): a client without
credentials, or with wrong ones, is refused.
"""

from __future__ import annotations

import aetcd

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


def client(host: str, port: int, creds: Credentials | None, timeout: float) -> aetcd.Client:
    """A client that logs in on connect. etcd drops its token when the user's password is
    rewritten (the auth Job rotating it) and after 5 idle minutes: every caller drops its client
    on an error and connects again, which logs in anew."""
    return aetcd.Client(
        host=host,
        port=port,
        username=creds.user if creds else None,
        password=creds.password if creds else None,
        timeout=timeout,  # aetcd annotates int; grpc takes a float
    )


def from_settings(settings: Settings, timeout: float) -> aetcd.Client:
    return client(settings.etcd_host, settings.etcd_port, credentials(settings), timeout)
