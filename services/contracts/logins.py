"""A login to one of our servers (etcd, Kafka, the schema registry): one shape for all of them, so
a password never shows in a repr or a log line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)


# The gateway's limiter Redis (edge namespace): its own Secret, key "password". Not a service's
# store, but the program (infra/gateway.py) and the local stack (its secrets file) name the same
# Secret, so the name lives here, where both already look for the platform's logins.
RATELIMIT_REDIS_SECRET = "ratelimit-redis-auth"
PASSWORD_KEY = "password"

# The canary's bearer token (apps namespace), key "token": the program renders it into the
# canary's env, the local stack signs one with its own identity provider for the canary user.
CANARY_SECRET = "canary"
CANARY_TOKEN_KEY = "token"
CANARY_USER = "canary"  # the local token's subject; in a cluster, whoever the IdP issued it to
