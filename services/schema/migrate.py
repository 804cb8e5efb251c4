"""Production's schema Job (`python -m services.schema.migrate`, in the services image): log in as
the admin role (creating it on a fresh cluster), apply the CQL files with this region's
replication, then the services' role. The same appliers the local stack runs; the passwords come
from Secrets in the Job's env, never argv.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from services.schema import cql_apply, cql_roles

# the Job's env (infra/scylla.py renders it)
CONTACT_POINTS_ENV = "CQL_CONTACT_POINTS"
LOCAL_DC_ENV = "CQL_LOCAL_DC"
REPLICATION_ENV = "CQL_REPLICATION"  # JSON {dc: rf}
CQL_DIR_ENV = "CQL_DIR"  # the mounted ConfigMap of services/schema/cql
ADMIN_PASSWORD_ENV = "CQL_ADMIN_PASSWORD"  # from cql_roles.ADMIN_SECRET
SERVICE_PASSWORD_ENV = "CQL_SERVICE_PASSWORD"  # from cql_roles.AUTH_SECRET


def main() -> None:
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster, Session
    from cassandra.policies import DCAwareRoundRobinPolicy

    from services.contracts import tls
    from services.contracts.settings import Settings

    env = os.environ
    ca_file = env.get(Settings.env_name("tls_ca_file"))  # Scylla's client port serves TLS
    ssl_context = tls.cassandra_context(ca_file) if ca_file else None

    def connect(user: str, password: str) -> tuple[Cluster, Session]:
        cluster = Cluster(
            env[CONTACT_POINTS_ENV].split(","),
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=env[LOCAL_DC_ENV]),
            auth_provider=PlainTextAuthProvider(user, password),
            ssl_context=ssl_context,
        )
        try:
            return cluster, cluster.connect()
        except BaseException:
            cluster.shutdown()
            raise

    cluster, session = cql_roles.admin_session(connect, env[ADMIN_PASSWORD_ENV], wait_s=300)
    try:
        replication = json.loads(env[REPLICATION_ENV])
        done = cql_apply.apply(session, replication, Path(env[CQL_DIR_ENV]))
        roles = cql_roles.apply(session, connect, env[SERVICE_PASSWORD_ENV])
        print(f"applied {len(done)} schema statements; roles: {'; '.join(roles)}")
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
