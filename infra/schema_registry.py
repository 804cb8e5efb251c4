"""Confluent Schema Registry on the cluster (stored in Kafka's `_schemas`), FORWARD compatibility,
and a Job that registers the repository's Avro schemas (services/contracts/avro/*.avsc)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx

REPO_ROOT = Path(__file__).resolve().parent.parent
AVRO_DIR = REPO_ROOT / "services" / "contracts" / "avro"
PORT = 8081
COMPATIBILITY = "FORWARD"
# Which topics' values each schema file describes (TopicNameStrategy: `<topic>-value`). A file
# not listed here registers under its record's full name.
TOPICS_BY_SCHEMA: dict[str, tuple[str, ...]] = {
    "like_event": ("likes.committed", "likes.voided", "likes.unvoided"),
}


@dataclass(frozen=True)
class SchemaRegistryArgs:
    namespace: str
    kafka_bootstrap: str
    replicas: int = 2
    image: str = "confluentinc/cp-schema-registry:8.1.0"
    avro_dir: Path = AVRO_DIR
    depends_on: Sequence[pulumi.Resource] = ()


def subjects(
    avro_dir: Path, topics_by_schema: Mapping[str, Sequence[str]] = TOPICS_BY_SCHEMA
) -> dict[str, str]:
    """subject -> schema text for every .avsc file; empty when there are none yet."""
    out: dict[str, str] = {}
    for path in sorted(avro_dir.glob("*.avsc")) if avro_dir.is_dir() else []:
        text = path.read_text()
        parsed = json.loads(text)  # a broken schema fails the plan, not the Job at 3 a.m.
        topics = topics_by_schema.get(path.stem)
        if topics:
            out.update({f"{t}-value": text for t in topics})
        else:
            ns = parsed.get("namespace")
            out[f"{ns}.{parsed['name']}" if ns else parsed["name"]] = text
    return out


def registration_bodies(subject_schemas: Mapping[str, str]) -> dict[str, str]:
    """ConfigMap entries: one JSON request body per subject, ready for `curl -d @file`."""
    return {
        f"{subject}.json": json.dumps({"schemaType": "AVRO", "schema": schema})
        for subject, schema in subject_schemas.items()
    }


REGISTER = """\
set -eu
url=http://{svc}:{port}
until curl -sf "$url/subjects" >/dev/null; do sleep 2; done
curl -sf -X PUT -H 'Content-Type: application/vnd.schemaregistry.v1+json' \\
  -d '{{"compatibility": "{level}"}}' "$url/config"
for body in /schemas/*.json; do
  [ -e "$body" ] || continue
  subject=$(basename "$body" .json)
  curl -sf -X PUT -H 'Content-Type: application/vnd.schemaregistry.v1+json' \\
    -d '{{"compatibility": "{level}"}}' "$url/config/$subject"
  # An identical schema returns the existing id; an incompatible one is a 409 and fails the Job.
  curl -sf -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' \\
    --data-binary @"$body" "$url/subjects/$subject/versions"
  echo " registered $subject"
done
"""


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
        container = kx.core.ContainerArgs(
            name="schema-registry",
            image=args.image,
            env=kx.env(
                {
                    "SCHEMA_REGISTRY_HOST_NAME": f"{name}.{ns}.svc.cluster.local",
                    "SCHEMA_REGISTRY_LISTENERS": f"http://0.0.0.0:{PORT}",
                    "SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS": args.kafka_bootstrap,
                    "SCHEMA_REGISTRY_KAFKASTORE_TOPIC": "_schemas",
                    "SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR": "3",
                    # FORWARD: events written with a new schema stay readable by old consumers.
                    "SCHEMA_REGISTRY_SCHEMA_COMPATIBILITY_LEVEL": COMPATIBILITY.lower(),
                    "SCHEMA_REGISTRY_HEAP_OPTS": "-Xms512m -Xmx512m",
                }
            ),
            ports=[kx.core.ContainerPortArgs(name="http", container_port=PORT)],
            resources=kx.resources("250m", "1Gi", cpu_limit="1"),
            liveness_probe=kx.http_probe("/", PORT, delay=30),
            readiness_probe=kx.http_probe("/subjects", PORT, delay=10),
            # The image writes its rendered config under /etc/schema-registry at start.
            security_context=kx.security(read_only=False, uid=1000),
        )
        deploy = k8s.apps.v1.Deployment(
            name,
            metadata=kx.meta(name, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=args.replicas,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=1000),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )
        kx.pdb(name, ns, match, lbls, child, max_unavailable=1)
        bodies = registration_bodies(subjects(args.avro_dir))
        digest = hashlib.sha256(json.dumps(bodies, sort_keys=True).encode()).hexdigest()[:10]
        job_lbls = kx.labels(f"{name}-register", "schema-registration", "job")
        k8s.core.v1.ConfigMap(
            f"{name}-schemas",
            metadata=kx.meta(f"{name}-schemas-{digest}", ns, job_lbls),
            data=bodies or None,
            opts=child,
        )
        script = REGISTER.format(
            svc=f"{name}.{ns}.svc.cluster.local", port=PORT, level=COMPATIBILITY
        )
        k8s.batch.v1.Job(
            f"{name}-register",
            metadata=kx.meta(f"{name}-register-{digest}", ns, job_lbls),
            spec=k8s.batch.v1.JobSpecArgs(
                backoff_limit=10,
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=job_lbls),
                    spec=kx.core.PodSpecArgs(
                        restart_policy="OnFailure",
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=100),
                        containers=[
                            kx.core.ContainerArgs(
                                name="register",
                                image="curlimages/curl:8.11.1",
                                command=["sh", "-c", script],
                                resources=kx.resources("50m", "64Mi"),
                                security_context=kx.security(uid=100),
                                volume_mounts=[kx.mount("schemas", "/schemas", read_only=True)],
                            )
                        ],
                        volumes=[kx.config_volume("schemas", f"{name}-schemas-{digest}")],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[deploy]),
        )
        self.url = f"http://{name}.{ns}.svc.cluster.local:{PORT}"
        self.subjects = sorted(s.removesuffix(".json") for s in bodies)
        self.register_outputs({"url": self.url, "subjects": self.subjects})
