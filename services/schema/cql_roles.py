"""The edge-store's logins (PasswordAuthenticator + CassandraAuthorizer), idempotently: an admin
role that applies the schema, the services' role that may read and write the platform's keyspace
and nothing else, and no default superuser left behind.

Shared by the local stack's bootstrap (Cassandra 5) and production's migration Job (Scylla,
services/schema/migrate.py). A fresh cluster lets in only its default superuser,
cassandra/cassandra: it is used once, to create the admin role, and then dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

KEYSPACE = "likes"  # services/schema/cql/001_keyspace.cql creates it
SERVICE_ROLE = "likes"
SERVICE_PERMISSIONS = (
    "SELECT",
    "MODIFY",
)  # reads, writes, LWTs, TRUNCATE: no DDL, no other keyspace
ADMIN_ROLE = "likes_admin"
DEFAULT_SUPERUSER = "cassandra"  # its password is its name, on a fresh cluster only

# Kubernetes Secrets (played locally by the stack's secrets file), key PASSWORD_KEY in each
AUTH_SECRET = "scylla-auth"  # SERVICE_ROLE's password: the workloads' namespace and the data one
ADMIN_SECRET = "scylla-admin"  # ADMIN_ROLE's password: the data namespace only (the Job)
PASSWORD_KEY = "password"


class LoginError(Exception):
    """Neither the admin role nor the default superuser could log in."""


class _Session(Protocol):
    def execute(self, query: str, *args: object, **kwargs: object) -> Any: ...


class _Cluster(Protocol):
    def shutdown(self) -> None: ...


# (user, password) -> a connected (cluster, session); raises the driver's error
Connect = Callable[[str, str], tuple[_Cluster, _Session]]


def is_auth_failure(error: BaseException) -> bool:
    """The server answered and refused the login (rather than not answering at all)."""
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    if isinstance(error, AuthenticationFailed):
        return True
    return isinstance(error, NoHostAvailable) and any(
        isinstance(e, AuthenticationFailed) for e in error.errors.values()
    )


def quote(value: str) -> str:
    """A CQL string literal (role options take no bind markers)."""
    return "'" + value.replace("'", "''") + "'"


def admin_session(
    connect: Connect, admin_password: str, wait_s: float = 30.0
) -> tuple[_Cluster, _Session]:
    """A session as ADMIN_ROLE. On a fresh cluster (only the default superuser exists, and only
    once the server has created it) log in as that, create ADMIN_ROLE, and log in again."""
    try:
        return connect(ADMIN_ROLE, admin_password)
    except Exception as e:
        if not is_auth_failure(e):
            raise
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cluster, session = connect(DEFAULT_SUPERUSER, DEFAULT_SUPERUSER)
            break
        except Exception as e:
            if not is_auth_failure(e):
                raise
            if time.monotonic() > deadline:
                raise LoginError(
                    f"neither {ADMIN_ROLE} (with the admin Secret's password) nor the default "
                    f"superuser can log in: {e}"
                ) from e
            time.sleep(0.5)
    try:
        session.execute(
            f"CREATE ROLE IF NOT EXISTS {ADMIN_ROLE} "
            f"WITH SUPERUSER = true AND LOGIN = true AND PASSWORD = {quote(admin_password)}"
        )
    finally:
        cluster.shutdown()
    return connect(ADMIN_ROLE, admin_password)


def can_login(connect: Connect, user: str, password: str) -> bool:
    try:
        cluster, _ = connect(user, password)
    except Exception as e:
        if is_auth_failure(e):
            return False
        raise
    cluster.shutdown()
    return True


def apply(
    session: _Session, connect: Connect, service_password: str, keyspace: str = KEYSPACE
) -> list[str]:
    """Run as ADMIN_ROLE, after the schema (a grant needs its keyspace): the services' role with
    the Secret's password and its grants, and no default superuser. The password is written only
    when the role cannot log in with it (Cassandra refuses a second change within 5 s, and each
    costs a bcrypt). Returns what it ran, without the password."""
    ran = []
    if not can_login(connect, SERVICE_ROLE, service_password):
        exists = SERVICE_ROLE in {row.role for row in session.execute("LIST ROLES")}
        verb = "ALTER" if exists else "CREATE"
        session.execute(
            f"{verb} ROLE {SERVICE_ROLE} WITH PASSWORD = {quote(service_password)} AND LOGIN = true"
        )
        ran.append(f"{verb} ROLE {SERVICE_ROLE}")
    for stmt in (
        *(f"GRANT {p} ON KEYSPACE {keyspace} TO {SERVICE_ROLE}" for p in SERVICE_PERMISSIONS),
        f"DROP ROLE IF EXISTS {DEFAULT_SUPERUSER}",
    ):
        session.execute(stmt)
        ran.append(stmt)
    return ran
