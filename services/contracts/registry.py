"""Schema registry access: HTTP basic auth (the user every client logs in as, the Secret holding
its password, the password file both registries read) and the one client builder. Light on
purpose: no client library.

Production's Confluent registry checks logins with Jetty's PropertyFileLoginModule
(infra/schema_registry.py); the local stand-in (local/schema_registry) reads the same file
format. Basic auth alone does not restrict what a logged-in user does: producers cannot register
schemas because their serializer runs with `auto.register.schemas` off (contracts/clients.py),
and the deploy step (services/schema/registry_schemas.py) registers them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.contracts.logins import Credentials as Credentials
from services.contracts.settings import Settings

SERVICE_USER = "likes"  # the workloads and the registration Job
ROLE = "user"  # the one role the registry admits (`authentication.roles`)
REALM = "SchemaRegistry-Props"  # the JAAS entry naming the login module
AUTH_SECRET = "schema-registry-auth"  # SERVICE_USER's password: the workloads' and data namespaces
PASSWORD_KEY = "password"


def credentials(settings: Settings) -> Credentials | None:
    if settings.schema_registry_user is None or settings.schema_registry_password is None:
        return None
    return Credentials(
        settings.schema_registry_user, settings.schema_registry_password.get_secret_value()
    )


def client_config(
    url: str,
    creds: Credentials | None,
    timeout: float = 2,
    ca_file: str | None = None,
    retries: int | None = None,
) -> dict[str, Any]:
    """confluent-kafka's SchemaRegistryClient settings; an https URL is verified against
    `ca_file` (the platform's CA) when it is set. `retries`: how often a request that failed
    (refused, reset, timed out, a 5xx) is tried again; the client's default is 3, with a
    jittered backoff of up to 1, 2 and 4 s between them (seconds a user's request cannot wait)."""
    conf: dict[str, Any] = {"url": url, "timeout": timeout}
    if retries is not None:
        conf["max.retries"] = retries
    if creds is not None:
        conf["basic.auth.user.info"] = f"{creds.user}:{creds.password}"
    if ca_file is not None:
        conf["ssl.ca.location"] = ca_file
    return conf


def from_settings(
    settings: Settings, timeout: float = 2, retries: int | None = None
) -> dict[str, Any]:
    return client_config(
        settings.schema_registry_url, credentials(settings), timeout, settings.tls_ca_file, retries
    )


def password_file(users: Iterable[Credentials]) -> str:
    """Jetty's PropertyFileLoginModule file: `user: password,role` per line."""
    lines = []
    for c in users:
        if any(ch in c.user for ch in ":= \n") or any(ch in c.password for ch in ", \n"):
            raise ValueError(f"user {c.user!r}: a name or password the file format cannot hold")
        lines.append(f"{c.user}: {c.password},{ROLE}")
    return "\n".join(lines) + "\n"


def parse_password_file(text: str) -> dict[str, str]:
    """user -> password of the users holding ROLE (the local stand-in's reading of the file)."""
    out = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, _, rest = line.partition(":")
        password, *roles = (x.strip() for x in rest.split(","))
        if ROLE in roles:
            out[user.strip()] = password
    return out


# Confluent Platform 8 runs Jetty 12, where the module moved from org.eclipse.jetty.jaas.spi;
# the old name makes every login fail with 401 while the registry looks healthy
LOGIN_MODULE = "org.eclipse.jetty.security.jaas.spi.PropertyFileLoginModule"


def jaas_file(password_path: str) -> str:
    """The JAAS file pointing Confluent's registry (8.x) at the password file (no secret in
    it)."""
    return (
        f'{REALM} {{\n  {LOGIN_MODULE} required\n  file="{password_path}"\n  debug="false";\n}};\n'
    )
