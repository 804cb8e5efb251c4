"""Confluent Schema Registry on the cluster (stored in Kafka's `_schemas`), FORWARD compatibility,
and the deploy step that registers the repository's Avro schemas (services/contracts/avro/*.avsc).

Every call logs in (HTTP basic auth: Jetty's PropertyFileLoginModule over a password file from a
Secret), and the registry logs in to Kafka as its own SCRAM user. Producers never register
schemas (`auto.register.schemas` off): a Job runs the repository's applier
(services/schema/registry_schemas.py, the one the local stack runs) once the registry answers.

HTTPS only, with a certificate from the platform's CA (infra/tls.py). Jetty reads no PEM
keystore (confluentinc/schema-registry#2905), so cert-manager also writes the certificate as a
PKCS#12 keystore; the registry reaches Kafka's TLS listener with the CA as a PEM truststore
(Kafka's Java client reads PEM).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx
from infra import tls as tls_infra
from services.contracts import kafka as kafka_contract
from services.contracts import registry as registry_contract
from services.contracts import tls
from services.contracts.settings import Settings
from services.schema import registry_schemas

PORT = 8081
COMPATIBILITY = registry_schemas.COMPATIBILITY
AUTH_DIR = "/etc/schema-registry/auth"  # the login Secret's files (the image writes its config
JAAS_FILE = "jaas.conf"  # beside them, under /etc/schema-registry)
PASSWORD_FILE = "password.properties"
LOGIN_SECRET = "schema-registry-login"  # JAAS_FILE and PASSWORD_FILE: the registry's own
TLS_DIR = "/etc/schema-registry/tls"  # its certificate Secret (tls.REGISTRY)
KEYSTORE_FILE = "keystore.p12"  # cert-manager's name for the PKCS#12 keystore it adds
# cert-manager requires a password for the PKCS#12 keystore; it guards a file the certificate
# Secret already guards, so it is the registry's own login password (not a new secret to rotate)
KEYSTORE_PASSWORD_SECRET = registry_contract.AUTH_SECRET


@dataclass(frozen=True)
class SchemaRegistryArgs:
    namespace: str
    kafka_bootstrap: str
    password: pulumi.Input[str]  # registry_contract.SERVICE_USER's (basic auth)
    # the registry's own Kafka user's (kafka_contract.REGISTRY_SECRET, which infra/kafka.py
    # writes): read at start only, so a rotation restarts the pods
    kafka_password: pulumi.Input[str]
    registration_image: str  # the services image: it holds the applier
    replicas: int = 2
    image: str = "confluentinc/cp-schema-registry:8.1.0"
    depends_on: Sequence[pulumi.Resource] = ()
    cert_depends_on: Sequence[pulumi.Resource] = ()  # the internal CA's issuer


def _password_file(password: str) -> str:
    return registry_contract.password_file(
        [registry_contract.Credentials(registry_contract.SERVICE_USER, password)]
    )


class SchemaRegistry(pulumi.ComponentResource):
    url: str
    subjects: list[str]

    def __init__(
        self, name: str, args: SchemaRegistryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:SchemaRegistry", name, None, opts)
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(name, "schema-registry", "datastore")
        match = kx.selector(name)
        kx.service_account(name, ns, lbls, child)
        kx.headless_service(name, ns, lbls, match, {"http": PORT}, child, headless=False)
        secrets = [
            k8s.core.v1.Secret(
                f"{name}-login",
                metadata=kx.meta(LOGIN_SECRET, ns, lbls),
                type="Opaque",
                string_data={
                    JAAS_FILE: registry_contract.jaas_file(f"{AUTH_DIR}/{PASSWORD_FILE}"),
                    PASSWORD_FILE: pulumi.Output.from_input(args.password).apply(_password_file),
                },
                opts=child,
            ),
            # the registration Job's copy of the services' login
            k8s.core.v1.Secret(
                f"{name}-auth",
                metadata=kx.meta(registry_contract.AUTH_SECRET, ns, lbls),
                type="Opaque",
                string_data={registry_contract.PASSWORD_KEY: args.password},
                opts=child,
            ),
        ]
        cert = tls_infra.certificate(
            f"{name}-tls",
            tls.REGISTRY.secret,
            ns,
            tls_infra.service_names(name, ns),
            pulumi.ResourceOptions(parent=self, depends_on=[*args.cert_depends_on, *secrets]),
            keystore_password=(KEYSTORE_PASSWORD_SECRET, registry_contract.PASSWORD_KEY),
        )
        keystore_password = kx.SecretRef(KEYSTORE_PASSWORD_SECRET, registry_contract.PASSWORD_KEY)
        env = kx.env(
            {
                "SCHEMA_REGISTRY_HOST_NAME": f"{name}.{ns}.svc.cluster.local",
                "SCHEMA_REGISTRY_LISTENERS": f"https://0.0.0.0:{PORT}",
                "SCHEMA_REGISTRY_SSL_KEYSTORE_TYPE": "PKCS12",
                "SCHEMA_REGISTRY_SSL_KEYSTORE_LOCATION": f"{TLS_DIR}/{KEYSTORE_FILE}",
                "SCHEMA_REGISTRY_SSL_KEYSTORE_PASSWORD": keystore_password,
                "SCHEMA_REGISTRY_SSL_KEY_PASSWORD": keystore_password,
                "SCHEMA_REGISTRY_SSL_ENABLED_PROTOCOLS": "TLSv1.3,TLSv1.2",
                "SCHEMA_REGISTRY_KAFKASTORE_SSL_TRUSTSTORE_TYPE": "PEM",
                "SCHEMA_REGISTRY_KAFKASTORE_SSL_TRUSTSTORE_LOCATION": f"{TLS_DIR}/{tls.CA_KEY}",
                "SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS": args.kafka_bootstrap,
                "SCHEMA_REGISTRY_KAFKASTORE_TOPIC": kafka_contract.REGISTRY_TOPIC,
                "SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR": "3",
                "SCHEMA_REGISTRY_KAFKASTORE_GROUP_ID": kafka_contract.REGISTRY_GROUP,
                # the registry's own Kafka user (its ACLs: the _schemas topic and its group)
                "SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL": kafka_contract.SECURITY_PROTOCOL,
                "SCHEMA_REGISTRY_KAFKASTORE_SASL_MECHANISM": kafka_contract.SASL_MECHANISM,
                "SCHEMA_REGISTRY_KAFKASTORE_SASL_JAAS_CONFIG": kx.SecretRef(
                    kafka_contract.REGISTRY_SECRET, kafka_contract.JAAS_KEY
                ),
                # FORWARD: events written with a new schema stay readable by old consumers.
                "SCHEMA_REGISTRY_SCHEMA_COMPATIBILITY_LEVEL": COMPATIBILITY.lower(),
                # every call logs in; the file names the users, the Secret holds the file
                "SCHEMA_REGISTRY_AUTHENTICATION_METHOD": "BASIC",
                "SCHEMA_REGISTRY_AUTHENTICATION_REALM": registry_contract.REALM,
                "SCHEMA_REGISTRY_AUTHENTICATION_ROLES": registry_contract.ROLE,
                "SCHEMA_REGISTRY_OPTS": f"-Djava.security.auth.login.config={AUTH_DIR}/{JAAS_FILE}",
                "SCHEMA_REGISTRY_HEAP_OPTS": "-Xms512m -Xmx512m",
            }
        )
        container = kx.core.ContainerArgs(
            name="schema-registry",
            image=args.image,
            env=env,
            ports=[kx.core.ContainerPortArgs(name="http", container_port=PORT)],
            resources=kx.resources("250m", "1Gi", cpu_limit="1"),
            # every HTTP path requires a login, which a probe does not carry: the port answers
            liveness_probe=kx.tcp_probe(PORT, delay=30),
            readiness_probe=kx.tcp_probe(PORT, delay=10),
            # The image writes its rendered config under /etc/schema-registry at start.
            security_context=kx.security(read_only=False, uid=1000),
            volume_mounts=[
                kx.mount("login", AUTH_DIR, read_only=True),
                kx.mount("tls", TLS_DIR, read_only=True),
            ],
        )
        deploy = k8s.apps.v1.Deployment(
            name,
            metadata=kx.meta(name, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=args.replicas,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls,
                        # the login file and the Kafka login are read at start: a rotated
                        # password rolls the pods (a Secret edit alone does not)
                        annotations={
                            kx.CREDENTIALS_ANNOTATION: kx.credentials_digest(
                                {
                                    LOGIN_SECRET: args.password,
                                    kafka_contract.REGISTRY_SECRET: args.kafka_password,
                                }
                            )
                        },
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=1000),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=[
                            kx.core.VolumeArgs(
                                name="login",
                                secret=kx.core.SecretVolumeSourceArgs(
                                    secret_name=LOGIN_SECRET, default_mode=0o440
                                ),
                            ),
                            kx.secret_volume(
                                "tls",
                                tls.REGISTRY.secret,
                                {k: k for k in (tls.CA_KEY, KEYSTORE_FILE)},
                            ),
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*args.depends_on, *secrets, cert]),
        )
        kx.pdb(name, ns, match, lbls, child, max_unavailable=1)
        self.url = f"https://{name}.{ns}.svc.cluster.local:{PORT}"
        subject_schemas = registry_schemas.subjects()
        self._registration_job(name, args, subject_schemas, [deploy, *secrets])
        self.subjects = sorted(subject_schemas)
        self.register_outputs({"url": self.url, "subjects": self.subjects})

    def _registration_job(
        self,
        name: str,
        args: SchemaRegistryArgs,
        subject_schemas: dict[str, str],
        after: list[pulumi.Resource],
    ) -> None:
        """The deploy step: register every schema of the repository at the declared level.
        Named after the schemas' digest: a Job is immutable, so a changed schema runs a new one
        (a rerun of the same schemas changes nothing)."""
        digest = hashlib.sha256(json.dumps(subject_schemas, sort_keys=True).encode()).hexdigest()
        job_name = f"{name}-register-{digest[:10]}"
        env = kx.env(
            Settings.render_env(
                {
                    "schema_registry_url": self.url,
                    "schema_registry_user": registry_contract.SERVICE_USER,
                    "schema_registry_password": kx.SecretRef(
                        registry_contract.AUTH_SECRET, registry_contract.PASSWORD_KEY
                    ),
                    "tls_ca_file": tls.CA_FILE,
                }
            )
        )
        env.append(kx.core.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"))
        lbls = kx.labels(f"{name}-register", "schema-registration", "job")
        k8s.batch.v1.Job(
            f"{name}-register",
            metadata=kx.meta(job_name, args.namespace, lbls),
            # retried until the registry answers
            spec=kx.setup_job_spec(
                lbls,
                kx.core.ContainerArgs(
                    name="register",
                    image=args.registration_image,
                    command=["python", "-m", registry_schemas.__name__],
                    env=env,
                    resources=kx.resources("100m", "128Mi"),
                    security_context=kx.security(),
                    volume_mounts=[kx.mount("tls", tls.MOUNT_DIR, read_only=True)],
                ),
                volumes=[tls_infra.ca_volume("tls", tls.REGISTRY.secret)],
                # a rotated login re-runs it against the rolled registry: the deploy proves
                # the new password is the one the registry takes
                credentials={registry_contract.AUTH_SECRET: args.password},
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
