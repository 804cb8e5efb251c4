"""Turn etcd authentication on, idempotently: the root user (etcd requires it before `auth
enable`), the services' role (read/write on the platform's prefix, nothing else) and user, then
`auth enable`.

Shared by the local stack's bootstrap and production's etcd-auth Job (`python -m
services.schema.etcd_auth`, passwords from Secrets in its env, never in argv). When everything is
already as wanted it changes nothing; in particular it rewrites a password only when that password
does not log in, since etcd drops every token of a user whose password is rewritten.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import grpc
from aetcd import rpc

from services.contracts import etcd
from services.contracts.settings import Settings

ROOT_ROLE = "root"  # etcd's built-in superuser role
ROOT_PASSWORD_ENV = "ETCD_ROOT_PASSWORD"  # the Job's env (from etcd.ROOT_SECRET), not a setting


class AuthSetupError(Exception):
    """etcd refused the setup (a root password that is not the Secret's, say)."""


def range_end(prefix: bytes) -> bytes:
    """The end of the key range holding every key that starts with `prefix` (etcdctl --prefix)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _wanted_perm() -> rpc.Permission:
    key = etcd.PREFIX.encode()
    return rpc.Permission(permType=rpc.Permission.READWRITE, key=key, range_end=range_end(key))


async def apply(
    host: str,
    port: int,
    root_password: str,
    service: etcd.Credentials,
    timeout: float = 5.0,
    ca_file: str | None = None,
) -> list[str]:
    """Make etcd's auth store what the platform needs; returns what it changed ([] on a rerun).
    `ca_file`: etcd serves TLS, verified against this CA (contracts/tls.py)."""
    target = f"{host}:{port}"
    if ca_file is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
        channel = grpc.aio.secure_channel(target, creds)
    async with channel:
        return await _Setup(rpc.AuthStub(channel), timeout).run(root_password, service)


class _Setup:
    def __init__(self, stub: rpc.AuthStub, timeout: float) -> None:
        self.stub, self.timeout = stub, timeout
        self.metadata: tuple[tuple[str, str], ...] | None = None
        self.changed: list[str] = []

    async def _call(self, method: str, request: object, *, exists_ok: bool = False) -> object:
        try:
            return await getattr(self.stub, method)(
                request, timeout=self.timeout, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as e:
            if exists_ok and "already exists" in (e.details() or ""):
                return None
            raise AuthSetupError(f"etcd {method}: {e.details()}") from e

    async def _login(self, creds: etcd.Credentials) -> str | None:
        """The token, or None when etcd's auth is off; a wrong password raises."""
        request = rpc.AuthenticateRequest(name=creds.user, password=creds.password)
        try:
            reply = await self.stub.Authenticate(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            if "authentication is not enabled" in (e.details() or ""):
                return None
            raise AuthSetupError(f"etcd login as {creds.user}: {e.details()}") from e
        return str(reply.token)

    async def _can_login(self, creds: etcd.Credentials) -> bool:
        try:
            return await self._login(creds) is not None
        except AuthSetupError:
            return False

    async def _service_ok(self, service: etcd.Credentials) -> bool:
        """Auth is on and the service user logs in and holds exactly the wanted grant."""
        if not await self._can_login(service):
            return False
        user = await self._call("UserGet", rpc.AuthUserGetRequest(name=service.user))
        role = await self._call("RoleGet", rpc.AuthRoleGetRequest(role=etcd.SERVICE_ROLE))
        return etcd.SERVICE_ROLE in list(user.roles) and list(role.perm) == [_wanted_perm()]  # type: ignore[attr-defined]

    async def run(self, root_password: str, service: etcd.Credentials) -> list[str]:
        token = await self._login(etcd.Credentials(etcd.ROOT_USER, root_password))
        enabled = token is not None
        if enabled:
            self.metadata = (("token", str(token)),)
            try:
                if await self._service_ok(service):
                    return []
            except AuthSetupError:
                pass  # the role or user is missing: created below
        await self._ensure_user(etcd.ROOT_USER, root_password, ROOT_ROLE, login_ok=enabled)
        await self._ensure_role()
        login_ok = enabled and await self._can_login(service)
        await self._ensure_user(
            service.user, service.password, etcd.SERVICE_ROLE, login_ok=login_ok
        )
        if not enabled:
            await self._call("AuthEnable", rpc.AuthEnableRequest())
            self.changed.append("auth enable")
        return self.changed

    async def _ensure_role(self) -> None:
        name = etcd.SERVICE_ROLE
        added = await self._call("RoleAdd", rpc.AuthRoleAddRequest(name=name), exists_ok=True)
        if added is not None:
            self.changed.append(f"role add {name}")
        role = await self._call("RoleGet", rpc.AuthRoleGetRequest(role=name))
        wanted = _wanted_perm()
        for perm in list(role.perm):  # type: ignore[attr-defined]
            if perm != wanted:  # a grant the platform does not make: revoke it
                request = rpc.AuthRoleRevokePermissionRequest(
                    role=name, key=perm.key, range_end=perm.range_end
                )
                await self._call("RoleRevokePermission", request)
                self.changed.append(f"role revoke {name} {perm.key!r}")
        if wanted not in list(role.perm):  # type: ignore[attr-defined]
            await self._call(
                "RoleGrantPermission", rpc.AuthRoleGrantPermissionRequest(name=name, perm=wanted)
            )
            self.changed.append(f"role grant {name} readwrite {etcd.PREFIX}")

    async def _ensure_user(self, user: str, password: str, role: str, *, login_ok: bool) -> None:
        """The user exists with this password and holds `role`. `login_ok`: the password is
        already known to work (root's login), so it is not rewritten."""
        added = await self._call(
            "UserAdd", rpc.AuthUserAddRequest(name=user, password=password), exists_ok=True
        )
        if added is not None:
            self.changed.append(f"user add {user}")
        elif not login_ok:
            request = rpc.AuthUserChangePasswordRequest(name=user, password=password)
            await self._call("UserChangePassword", request)
            self.changed.append(f"user passwd {user}")
        if role == ROOT_ROLE:
            # etcd knows the root role without a RoleAdd in 3.4/3.5; adding it is harmless
            await self._call("RoleAdd", rpc.AuthRoleAddRequest(name=ROOT_ROLE), exists_ok=True)
        got = await self._call("UserGet", rpc.AuthUserGetRequest(name=user))
        if role not in list(got.roles):  # type: ignore[attr-defined]
            await self._call("UserGrantRole", rpc.AuthUserGrantRoleRequest(user=user, role=role))
            self.changed.append(f"user grant-role {user} {role}")


def main() -> None:
    """The production Job: etcd's address and the services' login from the LIKES_* variables
    the workloads get, root's password from ETCD_ROOT_PASSWORD."""
    env = os.environ
    name = Settings.env_name
    service = etcd.Credentials(env[name("etcd_user")], env[name("etcd_password")])
    changed = asyncio.run(
        apply(
            env[name("etcd_host")],
            int(env[name("etcd_port")]),
            env[ROOT_PASSWORD_ENV],
            service,
            ca_file=env.get(name("tls_ca_file")),
        )
    )
    print("etcd auth: " + ("; ".join(changed) if changed else "already as wanted"))


if __name__ == "__main__":
    try:
        main()
    except AuthSetupError as e:
        print(f"etcd auth: {e}", file=sys.stderr)
        sys.exit(1)
