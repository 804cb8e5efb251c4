"""The Pulumi program: read the stack config once, build each component, export the endpoints.

`infra/__main__.py` calls `main()` under `pulumi up`; `infra.plan` calls it under mocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi

from infra import (
    cdn,
    cluster,
    config,
    etcd,
    gateway,
    kafka,
    netpol,
    network,
    observability,
    operator,
    platform,
    redis,
    schema_registry,
    scylla,
    services,
)
from infra import k8s as kx
from infra import tls as tls_infra
from services.abuse import settings as abuse_settings
from services.contracts import etcd as etcd_contract
from services.contracts import kafka as kafka_contract
from services.contracts import logins, tls, workloads
from services.contracts import registry as registry_contract
from services.schema import cql_roles


def main() -> None:
    cfg = config.from_pulumi()
    prefix = cfg.name_prefix
    net = network.Network(
        "network",
        network.NetworkArgs(
            name_prefix=prefix, vpc_cidr=cfg.network.vpc_cidr, zones=cfg.zones, cluster_name=prefix
        ),
    )
    eks = cluster.Cluster(
        "cluster",
        cluster.ClusterArgs(
            cluster_name=prefix,
            region=cfg.region,
            kubernetes_version=cfg.kubernetes_version,
            zones=cfg.zones,
            private_subnet_ids=net.private_subnet_ids,
            node_groups=cfg.node_groups,
        ),
    )
    # Every in-cluster component talks to this cluster through the provider it inherits.
    in_cluster = pulumi.ResourceOptions(providers=[eks.provider])
    plat = platform.Platform("platform", platform.PlatformArgs(cfg.environment), in_cluster)
    ns = plat.namespaces
    internal_ca = tls_infra.InternalCa(
        "internal-ca",
        platform.NS_OPERATORS,
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=plat.operators),
    )
    issuer = (internal_ca.issuer,)
    secret_password = pulumi.Output.secret(cfg.redis_password.get_secret_value())
    etcd_password = pulumi.Output.secret(cfg.etcd_password.get_secret_value())
    scylla_password = pulumi.Output.secret(cfg.scylla_password.get_secret_value())
    kafka_password = pulumi.Output.secret(cfg.kafka_password.get_secret_value())
    registry_password = pulumi.Output.secret(cfg.schema_registry_password.get_secret_value())
    kafka_registry_password = pulumi.Output.secret(cfg.kafka_registry_password.get_secret_value())

    store = redis.Redis(
        "redis",
        redis.RedisArgs(
            namespace=platform.NS_DATA,
            version=cfg.redis.version,
            password=secret_password,
            count_cache_shards=cfg.redis.count_cache_shards,
            replicas_per_shard=cfg.redis.replicas_per_shard,
            count_cache_memory_gi=cfg.redis.count_cache_memory_gi,
            hot_pools=cfg.redis.hot_pools,
            idem_store_shards=cfg.redis.idem_store_shards,
            idem_store_memory_gi=cfg.redis.idem_store_memory_gi,
            idem_store_storage_gi=cfg.redis.idem_store_storage_gi,
            feature_store_shards=cfg.redis.feature_store_shards,
            feature_store_memory_gi=cfg.redis.feature_store_memory_gi,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_DATA]]),
    )
    k = cfg.kafka
    spine = kafka.Kafka(
        "kafka",
        kafka.KafkaArgs(
            namespace=platform.NS_DATA,
            region=cfg.region,
            zones=cfg.zones,
            version=k.version,
            controllers=k.controllers,
            brokers_per_zone=k.brokers_per_zone,
            broker_storage_gi=k.broker_storage_gi,
            broker_cpu=k.broker_cpu,
            broker_memory_gi=k.broker_memory_gi,
            partitions=k.partitions,
            dead_letter_partitions=k.dead_letter_partitions,
            dead_letter_retention_days=k.dead_letter_retention_days,
            retention_hours=k.retention_hours,
            replication_factor=k.replication_factor,
            min_insync_replicas=k.min_insync_replicas,
            mirror_maker_replicas=k.mirror_maker_replicas,
            service_password=kafka_password,
            registry_password=kafka_registry_password,
            peers=cfg.peers,
            depends_on=[*plat.operators, ns[platform.NS_DATA]],
            cert_depends_on=issuer,
        ),
        in_cluster,
    )
    image = f"{cfg.services.image_repository}:{cfg.services.image_tag}"
    s = cfg.scylla
    edge_store = scylla.Scylla(
        "scylla",
        scylla.ScyllaArgs(
            namespace=platform.NS_DATA,
            datacenter=cfg.region,
            zones=cfg.zones,
            version=s.version,
            members_per_rack=s.members_per_rack,
            storage_gi=s.storage_gi,
            cpu=s.cpu,
            memory_gi=s.memory_gi,
            replication_factor=s.replication_factor,
            peer_datacenters=s.peer_datacenters,
            external_seeds=[seed for p in cfg.peers for seed in p.scylla_seeds],
            migration_image=image,
            admin_password=pulumi.Output.secret(cfg.scylla_admin_password.get_secret_value()),
            service_password=scylla_password,
            depends_on=[*plat.operators, ns[platform.NS_DATA]],
            cert_depends_on=issuer,
        ),
        in_cluster,
    )
    config_store = etcd.Etcd(
        "etcd",
        etcd.EtcdArgs(
            namespace=platform.NS_DATA,
            members=cfg.etcd.members,
            storage_gi=cfg.etcd.storage_gi,
            version=cfg.etcd.version,
            root_password=pulumi.Output.secret(cfg.etcd_root_password.get_secret_value()),
            service_password=etcd_password,
            auth_image=image,
            cert_depends_on=issuer,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_DATA]]),
    )
    registry = schema_registry.SchemaRegistry(
        "schema-registry",
        schema_registry.SchemaRegistryArgs(
            namespace=platform.NS_DATA,
            kafka_bootstrap=spine.bootstrap_servers,
            password=registry_password,
            kafka_password=kafka_registry_password,
            registration_image=image,
            depends_on=[ns[platform.NS_DATA], spine],
            cert_depends_on=issuer,
        ),
        in_cluster,
    )
    o = cfg.observability
    obs = observability.Observability(
        "observability",
        observability.ObservabilityArgs(
            namespace=platform.NS_OBSERVABILITY,
            cluster_name=prefix,
            region=cfg.region,
            mimir_remote_write_url=o.mimir_remote_write_url,
            prometheus_retention=o.prometheus_retention,
            prometheus_storage_gi=o.prometheus_storage_gi,
            tempo_storage_gi=o.tempo_storage_gi,
            collector_replicas=o.collector_replicas,
            latency_threshold_ms=o.latency_threshold_ms,
            healthy_percent=o.healthy_percent,
            pagerduty_routing_key=pulumi.Output.secret(cfg.pagerduty_routing_key.get_secret_value())
            if cfg.pagerduty_routing_key
            else None,
            scrape_namespaces=[
                platform.NS_APPS,
                platform.NS_EDGE,
                platform.NS_DATA,
                platform.NS_OBSERVABILITY,  # Prometheus and Alertmanager scrape themselves
            ],
            receivers=observability.AlertReceivers(o.ticket_webhook_url, o.heartbeat_url),
            redis_exporter=store.exporter,
            abuse_pagerduty_routing_key=pulumi.Output.secret(
                cfg.abuse_pagerduty_routing_key.get_secret_value()
            )
            if cfg.abuse_pagerduty_routing_key
            else None,
        ),
        pulumi.ResourceOptions(
            providers=[eks.provider], depends_on=[ns[platform.NS_OBSERVABILITY]]
        ),
    )
    env = workload_env(
        cfg,
        {
            "count_cache_nodes": store.count_cache_seeds,
            "idem_store_nodes": store.idem_store_seeds,
            "cassandra_hosts": edge_store.contact_points,
            "cassandra_port": scylla.CQL_PORT,
            "cassandra_local_dc": edge_store.datacenter,
            "kafka_bootstrap": spine.bootstrap_servers,
            "schema_registry_url": registry.url,
            "etcd_host": config_store.client_host,
            "etcd_port": config_store.client_port,
            "otlp_endpoint": obs.otlp_endpoint,
        },
        hot_pools=store.hot_pool_endpoints,
        feature_store=store.feature_store_seeds,
    )
    apps = services.Services(
        "services",
        services.ServicesArgs(
            namespace=platform.NS_APPS,
            image=image,
            services=services.service_specs(
                {
                    workloads.WRITE.name: cfg.services.write,
                    workloads.READ.name: cfg.services.read,
                    workloads.HOTKEY_SAMPLER.name: cfg.services.hotkey_sampler,
                    workloads.OUTBOX_RELAY.name: cfg.services.outbox_relay,
                    workloads.AGGREGATOR.name: cfg.services.aggregator,
                    workloads.CONSUMER_LAG.name: cfg.services.consumer_lag,
                    workloads.CANARY.name: cfg.services.canary,
                    workloads.ABUSE_SCORER.name: cfg.services.abuse_scorer,
                },
                env,
                {workloads.ABUSE_MODEL.name: cfg.services.abuse_model},
            ),
            models_publish_schedule=cfg.services.abuse_model_publish_schedule,
            models_publisher=cfg.services.abuse_model_publish,
            models_storage_class=cfg.services.abuse_models_storage_class,
            redis_password=secret_password,
            cdn_purge_token=pulumi.Output.secret(cfg.cdn_purge_token.get_secret_value()),
            canary_token=pulumi.Output.secret(cfg.canary_token.get_secret_value()),
            etcd_password=etcd_password,
            cassandra_password=scylla_password,
            kafka_password=kafka_password,
            registry_password=registry_password,
            cert_depends_on=issuer,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_APPS]]),
    )
    operator.Operator(
        "operator",
        operator.OperatorArgs(
            namespace=platform.NS_APPS,
            image=cfg.services.operator_image,
            hot_pools=cfg.redis.hot_pools,
            env=env[workloads.HOTKEY_OPERATOR.name],
            cert_depends_on=issuer,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[apps]),
    )
    g = cfg.gateway
    edge = gateway.Gateway(
        "gateway",
        gateway.GatewayArgs(
            namespace=platform.NS_EDGE,
            hostname=cfg.cdn.hostname,
            min_replicas=g.min_replicas,
            max_replicas=g.max_replicas,
            per_user_writes_per_min=g.per_user_writes_per_min,
            per_ip_writes_per_min=g.per_ip_writes_per_min,
            per_ip_batch_reads_per_min=g.per_ip_batch_reads_per_min,
            mirror_percent=g.mirror_percent,
            jwt_issuer=g.jwt_issuer,
            jwks_uri=g.jwks_uri,
            jwt_audience=g.jwt_audience,
            write_upstream=apps.upstreams[workloads.WRITE.name],
            read_upstream=apps.upstreams[workloads.READ.name],
            sampler_upstream=apps.upstreams[workloads.HOTKEY_SAMPLER.name],
            otlp_upstream=obs.otlp_grpc_address,
            ratelimit_redis_password=pulumi.Output.secret(
                cfg.ratelimit_redis_password.get_secret_value()
            ),
            depends_on=plat.operators,
            cert_depends_on=issuer,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_EDGE]]),
    )
    netpol.NetworkPolicies(
        "network-policies",
        netpol.NetpolArgs(
            apps_namespace=platform.NS_APPS,
            edge_namespace=platform.NS_EDGE,
            data_namespace=platform.NS_DATA,
            observability_namespace=platform.NS_OBSERVABILITY,
            operators_namespace=platform.NS_OPERATORS,
            env=env,
            registry_kafka_bootstrap=spine.bootstrap_servers,
            kafka_cluster=kafka.KafkaArgs.cluster_name,
            scylla_cluster=scylla.ScyllaArgs.cluster_name,
            peers=cfg.peers,
            scylla_multi_dc=bool(s.peer_datacenters),
            vpc_cidr=cfg.network.vpc_cidr,
            zones=len(cfg.zones),
            dials=[*edge.dials, *obs.dials],
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=list(ns.values())),
    )
    edge_cache = cdn.Cdn(
        "cdn",
        cdn.CdnArgs(
            zone_id=cfg.cdn.zone_id,
            hostname=cfg.cdn.hostname,
            origin_hostname=edge.hostname,
            fallback_ttl_seconds=cfg.cdn.fallback_ttl_seconds,
            owns_zone=cfg.cdn.owns_zone,
            zone_hostnames=cfg.cdn.zone_hostnames,
        ),
    )
    pulumi.export("cluster_name", eks.cluster_name)
    pulumi.export("kubeconfig", eks.kubeconfig)
    pulumi.export("api_hostname", edge_cache.hostname)
    pulumi.export("gateway_origin", edge.hostname)
    pulumi.export("kafka_bootstrap", spine.bootstrap_servers)
    pulumi.export("kafka_topics", spine.topics)
    pulumi.export("schema_registry_url", registry.url)
    pulumi.export("schema_subjects", registry.subjects)


def workload_env(
    cfg: config.StackConfig,
    endpoints: Mapping[str, object],
    hot_pools: Sequence[str],
    feature_store: str = "",
) -> dict[str, dict[str, object]]:
    """Each workload's env, rendered from its settings class (the names are defined there, and
    a name the class does not have fails here, at plan time). `feature_store`: the feature-store's
    seeds, for the abuse scorer only (nothing else reads it, and only it may reach it)."""
    g = cfg.gateway
    common: dict[str, object] = {
        "env": cfg.environment,
        "region": cfg.region,
        **endpoints,
        "redis_password": kx.SecretRef(services.AUTH_SECRET, "password"),
        "cassandra_user": cql_roles.SERVICE_ROLE,
        "cassandra_password": kx.SecretRef(cql_roles.AUTH_SECRET, cql_roles.PASSWORD_KEY),
        "etcd_user": etcd_contract.SERVICE_USER,
        "etcd_password": kx.SecretRef(etcd_contract.AUTH_SECRET, etcd_contract.PASSWORD_KEY),
        "kafka_user": kafka_contract.SERVICE_USER,
        "kafka_password": kx.SecretRef(kafka_contract.AUTH_SECRET, kafka_contract.PASSWORD_KEY),
        "schema_registry_user": registry_contract.SERVICE_USER,
        "schema_registry_password": kx.SecretRef(
            registry_contract.AUTH_SECRET, registry_contract.PASSWORD_KEY
        ),
        "jwks_url": g.jwks_uri,
        "jwt_issuer": g.jwt_issuer,
        "jwt_audience": g.jwt_audience,
        # every internal server's certificate comes from the platform's CA (infra/tls.py);
        # each workload's certificate Secret, mounted, carries it
        "tls_ca_file": tls.CA_FILE,
    }
    extra: dict[str, dict[str, object]] = {
        workloads.HOTKEY_SAMPLER.name: {"sampler_mirror_percent": g.mirror_percent},
        workloads.AGGREGATOR.name: {
            "cdn_purger": "cloudflare",
            "cloudflare_zone_id": cfg.cdn.zone_id,
            "cloudflare_api_token": kx.SecretRef(services.CDN_PURGE_SECRET, "token"),
            # MirrorMaker 2 brings the peers' events here: refresh their posts (review D3)
            "agg_peer_regions": ",".join(p.region for p in cfg.peers),
            "hot_pools": ",".join(hot_pools),  # always-replicate (contracts/hotkeys.py)
        },
        workloads.READ.name: {"hot_pools": ",".join(hot_pools)},
        # the public API, as users reach it: the CDN, the WAF and the gateway on its path
        workloads.CANARY.name: {
            "gateway_url": f"https://{cfg.cdn.hostname}",
            "canary_token": kx.SecretRef(services.CANARY_SECRET, logins.CANARY_TOKEN_KEY),
        },
        workloads.HOTKEY_OPERATOR.name: {"hot_pools": ",".join(hot_pools)},
        # its model server: the pod's sidecar, on localhost
        workloads.ABUSE_SCORER.name: {
            "abuse_model_target": workloads.ABUSE_MODEL.target,
            # more than one replica: the features' state must be shared (services/abuse/scorer.py)
            "abuse_feature_store": abuse_settings.feature_store_for(
                cfg.services.abuse_scorer.max_replicas
            ),
            "feature_store_nodes": feature_store,
        },
    }
    return {
        w.name: w.settings_class().render_env({**common, **extra.get(w.name, {})})
        for w in workloads.ALL
    }
