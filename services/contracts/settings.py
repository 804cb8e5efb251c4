"""Settings of every service and worker, from LIKES_* environment variables.

This class is the one definition of those variable names: the Pulumi program renders each
workload's env from it (`render_env`), and a process refuses a LIKES_* variable that its settings
class does not read (a misspelled name would otherwise be ignored, and the default used).
Defaults point at the local stack; outside `env=local` every endpoint must be set explicitly.

"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

PREFIX = "LIKES_"
# Read by the `likes` CLI and the test session, never by a workload: a workload's settings
# ignore exactly these (the local stack does not pass them to workloads anyway).
TOOLING_VARS = frozenset(
    {
        "LIKES_HOME",
        "LIKES_PORT_OFFSET",
        "LIKES_KAFKA_BROKERS",
        "LIKES_STACK",
        "LIKES_TEST_HOME",
        "LIKES_TEST_PORT_OFFSET",
        "LIKES_TEST_REUSE",
        "LIKES_TEST_TLS",
        "LIKES_TEST_FAULTS",
        "LIKES_TEST_STACKS",
        "LIKES_TEST_WORKERS",
        "LIKES_KEEP_STACK",
        "LIKES_OPERATOR",  # who the audit records name (cli/audit.py)
    }
)


class UnknownVariable(ValueError):
    """A LIKES_* variable no field reads: a typo or a name the program and the code disagree on."""


class _StrictEnv(EnvSettingsSource):
    """The env source, refusing LIKES_* variables that the settings class does not know."""

    def __call__(self) -> dict[str, Any]:
        known = self.settings_cls.env_names()  # type: ignore[attr-defined]
        unknown = sorted(
            k
            for k in os.environ
            if k.upper().startswith(PREFIX) and k.upper() not in known | TOOLING_VARS
        )
        if unknown:
            raise UnknownVariable(
                f"{self.settings_cls.__name__} does not read {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        return super().__call__()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid")

    env: Literal["local", "staging", "prod"] = "local"
    region: str = "local"

    count_cache_nodes: str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    # a Redis Cluster (AOF) in every environment: seed nodes, like the count-cache
    idem_store_nodes: str = "127.0.0.1:6390"
    # AUTH for count-cache, idem-store, hot pools and feature-store
    redis_password: SecretStr | None = None
    cassandra_hosts: str = "127.0.0.1"
    cassandra_port: int = 9042
    cassandra_local_dc: str | None = None  # None: the driver's default (the first host's DC)
    cassandra_keyspace: str = "likes"
    # the services' role (PasswordAuthenticator); None: connect without credentials
    cassandra_user: str | None = None
    cassandra_password: SecretStr | None = None
    kafka_bootstrap: str = "127.0.0.1:29092"
    # the services' Kafka user (SASL/SCRAM-SHA-512 on the client listener); None: no SASL
    kafka_user: str | None = None
    kafka_password: SecretStr | None = None
    schema_registry_url: str = "http://127.0.0.1:8081"
    # the registry's HTTP basic auth; None: anonymous calls
    schema_registry_user: str | None = None
    schema_registry_password: SecretStr | None = None
    etcd_host: str = "127.0.0.1"
    etcd_port: int = 2379
    # the services' etcd user (auth is on); None: connect without credentials
    etcd_user: str | None = None
    etcd_password: SecretStr | None = None
    # the CA that signed every internal server's certificate (contracts/tls.py); set: etcd,
    # Kafka, Scylla and the registry are reached over TLS and verified against it. Empty: plaintext,
    # chosen explicitly (the local quick profile); outside env=local it must be set like an endpoint
    tls_ca_file: str | None = None

    # Bearer JWTs are RS256/ES256, verified against the identity provider's JWKS; there is no
    # shared signing key anywhere (the local stack runs its own issuer, local/issuer.py).
    jwks_url: str = "http://127.0.0.1:8700/.well-known/jwks.json"
    jwt_issuer: str = "likes-local"
    jwt_audience: str = "likes"

    otlp_endpoint: str | None = None  # tracing is off unless an exporter is configured
    log_level: str = "INFO"

    # Fields that name another server or how to log in to it: outside env=local each must be
    # set, never defaulted.
    ENDPOINTS: ClassVar[tuple[str, ...]] = (
        "count_cache_nodes",
        "idem_store_nodes",
        "cassandra_hosts",
        "kafka_bootstrap",
        "schema_registry_url",
        "etcd_host",
        "jwks_url",
        "jwt_issuer",
        "redis_password",
        "cassandra_user",
        "cassandra_password",
        "etcd_user",
        "etcd_password",
        "kafka_user",
        "kafka_password",
        "schema_registry_user",
        "schema_registry_password",
        "tls_ca_file",
    )
    # a user without its password (or the reverse) is a half-rendered secret, not "no auth"
    LOGINS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("cassandra_user", "cassandra_password"),
        ("etcd_user", "etcd_password"),
        ("kafka_user", "kafka_password"),
        ("schema_registry_user", "schema_registry_password"),
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _StrictEnv(settings_cls))

    @classmethod
    def env_name(cls, field: str) -> str:
        if field not in cls.model_fields:
            raise UnknownVariable(f"{cls.__name__} has no setting {field!r}")
        return PREFIX + field.upper()

    @classmethod
    def env_names(cls) -> frozenset[str]:
        return frozenset(PREFIX + f.upper() for f in cls.model_fields)

    @classmethod
    def render_env(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """{LIKES_NAME: value} for field names; a name the class does not have is an error.
        Values pass through untouched (a Pulumi Output stays an Output)."""
        return {cls.env_name(k): v for k, v in values.items()}

    @field_validator("tls_ca_file")
    @classmethod
    def _empty_is_plaintext(cls, v: str | None) -> str | None:
        return v or None

    @model_validator(mode="after")
    def _explicit_outside_local(self) -> Settings:
        # a staging or prod pod that silently fell back to a loopback default would run against
        # nothing (or, worse, a developer's stack): every endpoint must come from the program
        if self.env != "local":
            missing = [self.env_name(f) for f in self.ENDPOINTS if f not in self.model_fields_set]
            if missing:
                raise ValueError(
                    f"env={self.env} refuses local defaults; set {', '.join(missing)} "
                    "(the program renders them)"
                )
        for user, password in self.LOGINS:
            if (getattr(self, user) is None) != (getattr(self, password) is None):
                raise ValueError(
                    f"set both {self.env_name(user)} and {self.env_name(password)}, or neither"
                )
        return self

    @property
    def count_cache_startup(self) -> list[tuple[str, int]]:
        return parse_nodes(self.count_cache_nodes)

    @property
    def idem_store_startup(self) -> list[tuple[str, int]]:
        return parse_nodes(self.idem_store_nodes)

    @property
    def redis_auth(self) -> str | None:
        return self.redis_password.get_secret_value() if self.redis_password else None


def parse_nodes(value: str) -> list[tuple[str, int]]:
    out = []
    for hp in value.split(","):
        host, port = hp.strip().rsplit(":", 1)
        out.append((host, int(port)))
    return out


class HotPoolSettings(Settings):
    """Settings of a workload that reaches the hot pools: the operator and the aggregator copy
    into them, the read service reads from them (contracts/hotkeys.py)."""

    # host:port of each hot pool, comma-separated, in pool order (pool i is the i-th address);
    # each address is one server (infra/redis.py), so a copy is read back where it was written
    hot_pools: str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103,127.0.0.1:7104"

    ENDPOINTS = (*Settings.ENDPOINTS, "hot_pools")

    @property
    def hot_pool_addresses(self) -> list[tuple[str, int]]:
        return parse_nodes(self.hot_pools) if self.hot_pools else []


class FeatureStoreSettings(Settings):
    """Settings of a workload that reaches the feature-store: the abuse scorer's shared feature
    state (services/abuse/shared_features.py), a Redis Cluster of its own that evicts
    (keys.EVICTION_POLICY), apart from the idem-store that never does."""

    # seed nodes of the cluster, like the idem-store's (same password: redis_password)
    feature_store_nodes: str = "127.0.0.1:6590"

    ENDPOINTS = (*Settings.ENDPOINTS, "feature_store_nodes")

    @property
    def feature_store_startup(self) -> list[tuple[str, int]]:
        return parse_nodes(self.feature_store_nodes)
