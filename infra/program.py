"""The Pulumi program: read the stack config once, build each component, export the endpoints.

`infra/__main__.py` calls `main()` under `pulumi up`; `infra.plan` calls it under mocks.
"""

from __future__ import annotations

import pulumi

from infra import (
    cdn,
    cluster,
    config,
    etcd,
    gateway,
    kafka,
    network,
    observability,
    operator,
    platform,
    redis,
    schema_registry,
    scylla,
    services,
)


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
    secret_password = pulumi.Output.secret(cfg.redis_password.get_secret_value())

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
            hot_pool_replicas=cfg.redis.hot_pool_replicas,
            idem_store_shards=cfg.redis.idem_store_shards,
            idem_store_memory_gi=cfg.redis.idem_store_memory_gi,
            idem_store_storage_gi=cfg.redis.idem_store_storage_gi,
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
            peers=cfg.peers,
            depends_on=[*plat.operators, ns[platform.NS_DATA]],
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
            depends_on=[*plat.operators, ns[platform.NS_DATA]],
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
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_DATA]]),
    )
    registry = schema_registry.SchemaRegistry(
        "schema-registry",
        schema_registry.SchemaRegistryArgs(
            namespace=platform.NS_DATA,
            kafka_bootstrap=spine.bootstrap_servers,
            depends_on=[ns[platform.NS_DATA]],
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
            scrape_namespaces=[platform.NS_APPS, platform.NS_EDGE, platform.NS_DATA],
        ),
        pulumi.ResourceOptions(
            providers=[eks.provider], depends_on=[ns[platform.NS_OBSERVABILITY]]
        ),
    )
    environment = {
        "LIKES_REGION": cfg.region,
        "LIKES_ENVIRONMENT": cfg.environment,
        "KAFKA_BOOTSTRAP": spine.bootstrap_servers,
        "SCHEMA_REGISTRY_URL": registry.url,
        "COUNT_CACHE_SEEDS": store.count_cache_seeds,
        "IDEM_STORE_SEEDS": store.idem_store_seeds,
        "HOT_POOLS": ",".join(store.hot_pool_endpoints),
        "ETCD_ENDPOINTS": config_store.client_endpoint,
        "CQL_CONTACT_POINTS": edge_store.contact_points,
        "CQL_LOCAL_DC": edge_store.datacenter,
        "OTEL_EXPORTER_OTLP_ENDPOINT": obs.otlp_endpoint,
    }
    apps = services.Services(
        "services",
        services.ServicesArgs(
            namespace=platform.NS_APPS,
            edge_namespace=platform.NS_EDGE,
            data_namespace=platform.NS_DATA,
            observability_namespace=platform.NS_OBSERVABILITY,
            operators_namespace=platform.NS_OPERATORS,
            image=image,
            services=services.service_specs(
                {
                    "write": cfg.services.write,
                    "read": cfg.services.read,
                    "hotkey_sampler": cfg.services.hotkey_sampler,
                    "outbox_relay": cfg.services.outbox_relay,
                    "aggregator": cfg.services.aggregator,
                    "abuse_scorer": cfg.services.abuse_scorer,
                }
            ),
            environment=environment,
            redis_password=secret_password,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_APPS]]),
    )
    operator.Operator(
        "operator",
        operator.OperatorArgs(
            namespace=platform.NS_APPS,
            image=cfg.services.operator_image,
            hot_pools=cfg.redis.hot_pools,
            environment=environment,
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
            mirror_percent=g.mirror_percent,
            jwt_issuer=g.jwt_issuer,
            jwks_uri=g.jwks_uri,
            write_upstream=apps.upstreams["write-svc"],
            read_upstream=apps.upstreams["read-svc"],
            sampler_upstream=apps.upstreams["hotkey-sampler"],
            depends_on=plat.operators,
        ),
        pulumi.ResourceOptions(providers=[eks.provider], depends_on=[ns[platform.NS_EDGE]]),
    )
    edge_cache = cdn.Cdn(
        "cdn",
        cdn.CdnArgs(
            zone_id=cfg.cdn.zone_id,
            hostname=cfg.cdn.hostname,
            origin_hostname=edge.hostname,
            fallback_ttl_seconds=cfg.cdn.fallback_ttl_seconds,
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
