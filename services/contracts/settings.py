"""Settings of every service and worker, from LIKES_* environment variables.

Defaults point at the local stack; outside `env=local` a default secret is refused at start-up.
"""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOCAL_JWT_SECRET = "local-only-signing-key-not-for-production"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIKES_", extra="ignore")

    env: Literal["local", "staging", "prod"] = "local"
    region: str = "local"

    count_cache_nodes: str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    idem_store_url: str = "redis://127.0.0.1:6390/0"
    cassandra_hosts: str = "127.0.0.1"
    cassandra_port: int = 9042
    cassandra_keyspace: str = "likes"
    kafka_bootstrap: str = "127.0.0.1:29092"
    schema_registry_url: str = "http://127.0.0.1:8081"
    etcd_host: str = "127.0.0.1"
    etcd_port: int = 2379

    jwt_secret: SecretStr = SecretStr(LOCAL_JWT_SECRET)
    jwt_issuer: str = "likes-local"
    jwt_audience: str = "likes"
    jwks_url: str | None = None  # production: the identity provider's JWKS (RS256/ES256)

    otlp_endpoint: str | None = None  # tracing is off unless an exporter is configured
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _no_default_secrets_outside_local(self) -> Settings:
        default_secret = self.jwt_secret.get_secret_value() == LOCAL_JWT_SECRET
        if self.env != "local" and self.jwks_url is None and default_secret:
            raise ValueError(
                "LIKES_JWT_SECRET is the local default; set a real secret or LIKES_JWKS_URL "
                f"for env={self.env}"
            )
        return self

    @property
    def count_cache_startup(self) -> list[tuple[str, int]]:
        out = []
        for hp in self.count_cache_nodes.split(","):
            host, port = hp.strip().rsplit(":", 1)
            out.append((host, int(port)))
        return out
