"""Our services (write, read, hot-key sampler, outbox relay, aggregator, consumer-lag, canary,
abuse scorer): Deployments, Services, HPAs, PDBs and ServiceAccounts (who may reach them:
infra/netpol.py); a workload's sidecar (the abuse model server) is a second container of its
pods, and the CronJob that publishes the versions it serves runs beside them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx
from infra import observability
from infra import redis as redis_infra
from infra import tls as tls_infra
from infra.config import ContainerSize, ServiceScale
from services.contracts import etcd, logins, registry, tls, workloads
from services.contracts import kafka as kafka_contract
from services.schema import cql_roles

AUTH_SECRET = redis_infra.AUTH_SECRET  # the Redis password Secret infra/redis.py creates
CDN_PURGE_SECRET = "cdn-purge"  # key `token`: the aggregator purges the CDN with it
CANARY_SECRET = logins.CANARY_SECRET  # the canary user's bearer token (services/canary)
MODELS_CLAIM = "abuse-models"  # the abuse model's versions (ReadWriteMany: every scorer pod)
MODELS_SIZE = "5Gi"  # a version is ~1 MB (model.joblib + meta.json): room for thousands
# The CronJob that trains the abuse model and publishes it into MODELS_CLAIM: `likes abuse train`
# (cli/main.py's app, by module like every container's command) with its gate, so a version below
# the goals is saved but never made current; --json: one line its logs keep.
MODELS_PUBLISHER = "abuse-model-publish"
# The same run once per image, at deploy: a fresh stack has no model until the schedule's first
# run (the scorer holds every like meanwhile), and a new image may bring features or a
# scikit-learn whose pickles the model servers refuse. The Job's pod template carries the image,
# and a Job's template cannot change: a new image replaces the Job, which trains again.
MODELS_PUBLISHER_AT_DEPLOY = f"{MODELS_PUBLISHER}-at-deploy"
PUBLISH_COMMAND = ("python", "-m", "cli.main", "abuse", "train", "--gate",
                   "--model-dir", workloads.MODELS_MOUNT, "--json")  # fmt: skip
# cli/abuse.py's EXIT_REFUSED (below the goals; no threshold) and EXIT_ERROR (a bad option): the
# same image trains the same model again, so they fail the Job at once, without a retry
PUBLISH_VERDICTS = (1, 2)
PUBLISH_RETRIES = 2  # an OOM or a lost node: the run again (a refusal is a verdict, not retried)
PUBLISH_DEADLINE_S = 2 * 3600  # minutes at the default size; a hung run frees the schedule


@dataclass(frozen=True)
class ServiceSpec:
    workload: workloads.Workload  # name, command, port and probes: the one definition
    scale: ServiceScale
    env: Mapping[str, object]  # LIKES_* name -> value or kx.SecretRef, rendered from settings
    sidecar: ContainerSize | None = None  # the sidecar's size, when the workload has one

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def http(self) -> bool:
        return self.workload.kind == "http"


@dataclass(frozen=True)
class ServicesArgs:
    namespace: str
    image: str
    services: Sequence[ServiceSpec]
    redis_password: pulumi.Input[str]
    cdn_purge_token: pulumi.Input[str]
    canary_token: pulumi.Input[str]
    etcd_password: pulumi.Input[str]
    cassandra_password: pulumi.Input[str]
    kafka_password: pulumi.Input[str]
    registry_password: pulumi.Input[str]
    models_publish_schedule: str  # MODELS_PUBLISHER's cron schedule, in UTC
    models_publisher: ContainerSize
    models_storage_class: str = "efs-sc"  # MODELS_CLAIM's class
    cert_depends_on: tuple[pulumi.Resource, ...] = ()  # the internal CA's issuer


def service_specs(
    scales: Mapping[str, ServiceScale],
    env: Mapping[str, Mapping[str, object]],
    sidecars: Mapping[str, ContainerSize],
) -> list[ServiceSpec]:
    """One spec per workload of the contract; `scales` and `env` are keyed by workload name,
    `sidecars` by sidecar name."""
    return [
        ServiceSpec(w, scales[w.name], env[w.name], sidecars[w.sidecar.name] if w.sidecar else None)
        for w in workloads.SERVICES
    ]


class Services(pulumi.ComponentResource):
    upstreams: dict[str, str]

    def __init__(
        self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Services", name, None, opts)
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        # Secrets do not cross namespaces: the services get their own copy of each store's
        # password (the stores' own namespace holds the original).
        for secret, data in (
            (AUTH_SECRET, {"password": args.redis_password}),
            (CDN_PURGE_SECRET, {"token": args.cdn_purge_token}),
            (CANARY_SECRET, {logins.CANARY_TOKEN_KEY: args.canary_token}),
            (etcd.AUTH_SECRET, {etcd.PASSWORD_KEY: args.etcd_password}),
            (cql_roles.AUTH_SECRET, {cql_roles.PASSWORD_KEY: args.cassandra_password}),
            (kafka_contract.AUTH_SECRET, {kafka_contract.PASSWORD_KEY: args.kafka_password}),
            (registry.AUTH_SECRET, {registry.PASSWORD_KEY: args.registry_password}),
        ):
            k8s.core.v1.Secret(
                f"{name}-{secret}",
                metadata=kx.meta(secret, ns, kx.labels("likes", secret, "app")),
                type="Opaque",
                string_data=data,
                opts=child,
            )
        if any(spec.workload.sidecar is workloads.ABUSE_MODEL for spec in args.services):
            # the training job publishes versions here; the model servers read them
            claim = k8s.core.v1.PersistentVolumeClaim(
                MODELS_CLAIM,
                metadata=kx.meta(MODELS_CLAIM, ns, kx.labels("likes", MODELS_CLAIM, "app")),
                spec=kx.core.PersistentVolumeClaimSpecArgs(
                    access_modes=["ReadWriteMany"],
                    storage_class_name=args.models_storage_class,
                    resources=kx.core.VolumeResourceRequirementsArgs(
                        requests={"storage": MODELS_SIZE}
                    ),
                ),
                opts=child,
            )
            self._models_publisher(args, claim)
        self.upstreams = {}
        for spec in args.services:
            self._service(spec, args)
            if spec.http:
                self.upstreams[spec.name] = (
                    f"{spec.name}.{ns}.svc.cluster.local:{spec.workload.port}"
                )
        self.register_outputs({"upstreams": self.upstreams})

    @staticmethod
    def _rotation(spec: ServiceSpec, args: ServicesArgs) -> dict[str, pulumi.Input[str]]:
        """A token a workload reads from its env at start (the canary's bearer token, the
        aggregator's CDN purge token): a rotated one rolls its pods, or they would keep the old
        one until they happened to restart."""
        tokens = {
            workloads.CANARY.name: args.canary_token,
            workloads.AGGREGATOR.name: args.cdn_purge_token,
        }
        if spec.name not in tokens:
            return {}
        return {kx.CREDENTIALS_ANNOTATION: kx.credentials_digest({"token": tokens[spec.name]})}

    def _service(self, spec: ServiceSpec, args: ServicesArgs) -> None:
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(spec.name, "http" if spec.http else "worker", "app")
        match = kx.selector(spec.name)
        kx.service_account(spec.name, ns, lbls, child)
        ops_port = spec.workload.ops_port  # probes and scrapes, plain HTTP
        ports = {"metrics": ops_port}
        if spec.http:
            ports = {"http": spec.workload.port, **ports}  # the API: mTLS from the gateway
            # Headless: Envoy resolves every pod (STRICT_DNS) and ejects outliers itself.
            kx.headless_service(spec.name, ns, lbls, match, {"http": spec.workload.port}, child)
        env = kx.env({**spec.env, "PYTHONDONTWRITEBYTECODE": "1"})
        command = spec.workload.command()
        memory = f"{spec.scale.memory_mi}Mi"
        container = kx.core.ContainerArgs(
            name=spec.name,
            image=args.image,
            command=command,
            env=env,
            ports=[kx.core.ContainerPortArgs(name=n, container_port=p) for n, p in ports.items()],
            resources=kx.resources(spec.scale.cpu, memory, cpu_limit=_double(spec.scale.cpu)),
            liveness_probe=kx.http_probe(workloads.HEALTH_PATH, ops_port, delay=5),
            readiness_probe=kx.http_probe(spec.workload.ready_path, ops_port, period=5),
            security_context=kx.security(),
            volume_mounts=[kx.mount("tmp", "/tmp"), kx.mount("tls", tls.MOUNT_DIR, True)],
        )
        containers, volumes = [container], [kx.empty_dir("tmp")]
        if spec.workload.sidecar is not None:
            containers.append(self._sidecar(spec.workload.sidecar, spec, args.image))
            volumes.append(_models_volume(read_only=True))
        secret, cert = tls_infra.workload_certificate(spec.name, ns, self, args.cert_depends_on)
        k8s.apps.v1.Deployment(
            spec.name,
            metadata=kx.meta(spec.name, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                strategy=kx.rolling_update(),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={
                            **observability.scrape_annotations(ops_port, workloads.METRICS_PATH),
                            **self._rotation(spec, args),
                        },
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=spec.name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(),
                        node_selector=kx.node_selector("services"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=containers,
                        volumes=[*volumes, tls_infra.cert_volume("tls", secret)],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=self, ignore_changes=["spec.replicas"], depends_on=[cert]
            ),
        )
        kx.hpa(
            spec.name,
            ns,
            lbls,
            "Deployment",
            spec.scale.min_replicas,
            spec.scale.max_replicas,
            child,
        )
        kx.pdb(spec.name, ns, match, lbls, child, max_unavailable="10%")

    @staticmethod
    def _sidecar(
        sidecar: workloads.Sidecar, spec: ServiceSpec, image: str
    ) -> kx.core.ContainerArgs:
        """The sidecar: its own probes on its own ops port, scraped by the `pod-sidecars` job
        for its port's name (the pod's scrape annotations name one port, the workload's). Only
        the pod reaches its gRPC port."""
        size = spec.sidecar or ContainerSize()
        return kx.core.ContainerArgs(
            name=sidecar.name,
            image=image,
            command=sidecar.command(),
            # one OpenMP thread per predict: each request scores a small batch, where
            # scikit-learn's OpenMP threads (one per node core by default) only spin. Measured
            # with 64-row batches: 3.1 ms of CPU per call with one thread, 9.3 ms with two, and
            # slower in wall time too. Requests run side by side on the server's own threads.
            env=kx.env({"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}),
            ports=[
                kx.core.ContainerPortArgs(name="grpc", container_port=sidecar.port),
                kx.core.ContainerPortArgs(
                    name=workloads.SIDECAR_METRICS_PORT, container_port=sidecar.ops_port
                ),
            ],
            resources=kx.resources(size.cpu, f"{size.memory_mi}Mi", cpu_limit=_double(size.cpu)),
            liveness_probe=kx.http_probe(workloads.HEALTH_PATH, sidecar.ops_port, delay=5),
            readiness_probe=kx.http_probe(workloads.READY_PATH, sidecar.ops_port, period=5),
            security_context=kx.security(),
            volume_mounts=[
                kx.mount("tmp", "/tmp"),
                kx.mount("models", workloads.MODELS_MOUNT, read_only=True),
            ],
        )

    def _models_publisher(self, args: ServicesArgs, claim: pulumi.Resource) -> None:
        """Train the abuse model on schedule and publish it into the claim the model servers
        read, which reload `current` on their own. Training is local (the traffic generator):
        its pods need no network, and get none (infra/netpol.py: DNS only, as any pod no
        policy selects)."""
        size = args.models_publisher
        lbls = kx.labels(MODELS_PUBLISHER, "model-publisher", "job")
        cpu_limit = _double(size.cpu)
        container = kx.core.ContainerArgs(
            name=MODELS_PUBLISHER,
            image=args.image,
            command=list(PUBLISH_COMMAND),
            # scikit-learn's OpenMP threads default to the node's cores, not the pod's limit:
            # on a large node they would only fight over it (CFS throttling)
            env=kx.env({"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": _cores(cpu_limit)}),
            resources=kx.resources(size.cpu, f"{size.memory_mi}Mi", cpu_limit=cpu_limit),
            security_context=kx.security(),
            volume_mounts=[kx.mount("tmp", "/tmp"), kx.mount("models", workloads.MODELS_MOUNT)],
        )
        run = kx.setup_job_spec(
            lbls,
            container,
            [kx.empty_dir("tmp"), _models_volume(read_only=False)],
            backoff_limit=PUBLISH_RETRIES,
            verdicts=PUBLISH_VERDICTS,
            deadline_s=PUBLISH_DEADLINE_S,
            node_class="services",  # minutes of CPU: not on the gateway's nodes
        )
        k8s.batch.v1.CronJob(
            MODELS_PUBLISHER,
            metadata=kx.meta(MODELS_PUBLISHER, args.namespace, lbls),
            spec=k8s.batch.v1.CronJobSpecArgs(
                schedule=args.models_publish_schedule,
                time_zone="Etc/UTC",  # not the controller manager's zone
                concurrency_policy="Forbid",  # a slow run is never joined by the next
                successful_jobs_history_limit=3,
                failed_jobs_history_limit=3,  # a refusal's pod keeps its logs: which goal failed
                job_template=k8s.batch.v1.JobTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls), spec=run
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[claim]),
        )
        k8s.batch.v1.Job(
            MODELS_PUBLISHER_AT_DEPLOY,
            # minutes of training: `pulumi up` does not wait for it (the scorer waits for the model)
            metadata=kx.meta(
                MODELS_PUBLISHER_AT_DEPLOY, args.namespace, lbls, {kx.SKIP_AWAIT: "true"}
            ),
            spec=run,
            # a new image replaces the Job under the same name: the old one goes first
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[claim], delete_before_replace=True
            ),
        )


def _models_volume(read_only: bool) -> kx.core.VolumeArgs:
    """MODELS_CLAIM as the pod's `models` volume: read-only for the model servers."""
    return kx.core.VolumeArgs(
        name="models",
        persistent_volume_claim=kx.core.PersistentVolumeClaimVolumeSourceArgs(
            claim_name=MODELS_CLAIM, read_only=read_only or None
        ),
    )


def _cores(cpu: str) -> str:
    """Whole cores of a CPU quantity, at least one ("1500m" -> "2")."""
    n = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return str(max(1, math.ceil(n)))


def _double(cpu: str) -> str:
    if cpu.endswith("m"):
        return f"{int(cpu[:-1]) * 2}m"
    return str(float(cpu) * 2).removesuffix(".0")
