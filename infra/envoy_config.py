"""The gateway's Envoy v3 bootstrap, built from typed envoy-data-plane objects.

TLS listener, JWT authentication (required for writes, optional for reads), routes to the write and
read services, 1% of reads mirrored to the hot-key sampler, global rate limits through the
envoyproxy/ratelimit service, JSON access logs. `ratelimit_service_config` gives that service's
config with descriptors keyed the way the write route sends them.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass
from typing import Any as JsonAny
from urllib.parse import urlsplit

import betterproto2
from envoy_data_plane.envoy.config.accesslog.v3 import (
    AccessLog,
    AccessLogFilter,
    ComparisonFilter,
    ComparisonFilterOp,
    StatusCodeFilter,
)
from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Admin,
    Bootstrap,
    BootstrapStaticResources,
    LayeredRuntime,
    RuntimeLayer,
    RuntimeLayerAdminLayer,
)
from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterDiscoveryType,
    ClusterDnsLookupFamily,
    ClusterLbPolicy,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    ApiVersion,
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    Http2ProtocolOptions,
    HttpUri,
    Node,
    RuntimeFractionalPercent,
    RuntimeUInt32,
    SocketAddress,
    SubstitutionFormatString,
    TransportSocket,
    TypedExtensionConfig,
    WatchedDirectory,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.ratelimit.v3 import RateLimitServiceConfig
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    RateLimit,
    RateLimitAction,
    RateLimitActionGenericKey,
    RateLimitActionRemoteAddress,
    RateLimitActionRequestHeaders,
    RetryPolicy,
    Route,
    RouteAction,
    RouteActionRequestMirrorPolicy,
    RouteConfiguration,
    RouteMatch,
    Tracing,
    VirtualHost,
)
from envoy_data_plane.envoy.config.trace.v3 import OpenTelemetryConfig, TracingHttp
from envoy_data_plane.envoy.extensions.access_loggers.stream.v3 import StdoutAccessLog
from envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 import (
    JwksAsyncFetch,
    JwtAuthentication,
    JwtClaimToHeader,
    JwtProvider,
    JwtRequirement,
    JwtRequirementOrList,
    RemoteJwks,
    RequirementRule,
)
from envoy_data_plane.envoy.extensions.filters.http.ratelimit.v3 import (
    RateLimit as RateLimitFilter,
)
from envoy_data_plane.envoy.extensions.filters.http.ratelimit.v3 import (
    RateLimitXRateLimitHeadersRfcVersion,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpConnectionManagerPathWithEscapedSlashesAction,
    HttpConnectionManagerTracing,
    HttpFilter,
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    HeaderMutation as EarlyHeaderMutation,
)
from envoy_data_plane.envoy.extensions.http.original_ip_detection.custom_header.v3 import (
    CustomHeaderConfig,
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    CommonTlsContextCombinedCertificateValidationContext,
    DownstreamTlsContext,
    SdsSecretConfig,
    Secret,
    SubjectAltNameMatcher,
    SubjectAltNameMatcherSanType,
    TlsCertificate,
    TlsParameters,
    TlsParametersTlsProtocol,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher, StringMatcher
from envoy_data_plane.envoy.type.v3 import FractionalPercent, FractionalPercentDenominatorType
from envoy_data_plane.google.protobuf import Any, Empty, Struct, Value

from infra import otel_config
from services.contracts import keys, routes, tls
from services.contracts import metrics as metric_names

__all__ = [
    "ADMIN_CLUSTER",
    "BATCH_READ_PATH",
    "FAIL_OPEN",
    "HTTPS_LISTENER",
    "INVALID_SUBJECT_BODY",
    "INVALID_SUBJECT_ROUTE",
    "IP_DESCRIPTOR_KEY",
    "JWKS_CLUSTER",
    "JWT_PROVIDER",
    "MIRROR_RUNTIME_KEY",
    "RATELIMIT_CLUSTER",
    "READ_CLUSTER",
    "READ_PATH_REGEX",
    "ROUTE_DESCRIPTOR_KEY",
    "SAMPLER_CLUSTER",
    "SERVICE_CLUSTERS",
    "STATS_LISTENER",
    "STATS_PATH",
    "TRACING_CLUSTER",
    "TRACING_SERVICE_NAME",
    "UPSTREAM_CA_SECRET",
    "UPSTREAM_CLIENT_SECRET",
    "USER_DESCRIPTOR_KEY",
    "WRITE_CLUSTER",
    "WRITE_DESCRIPTOR_VALUE",
    "WRITE_PATH",
    "EnvoyParams",
    "bootstrap_message",
    "build_bootstrap",
    "ratelimit_service_config",
]

# the services' routes, defined once (services/contracts/routes.py)
WRITE_PATH = routes.WRITE_PATH
READ_PATH_REGEX = routes.READ_PATH_REGEX
BATCH_READ_PATH = routes.BATCH_READ_PATH  # POST {"post_ids": [...]}: a feed page, ≤ 50 ids
JWT_PROVIDER = "likes_idp"
MIRROR_RUNTIME_KEY = "likes.reads.mirror_to_sampler"
# Descriptor keys: the write route sends (route=likes_write, user_id=<sub>) and
# (route=likes_write, remote_address=<client ip>); the ratelimit service config mirrors them.
ROUTE_DESCRIPTOR_KEY = "route"
WRITE_DESCRIPTOR_VALUE = "likes_write"
# the batch read is a POST, so the CDN cannot cache it: each one fans out to 50 posts at the
# origin; it is limited per client address like the writes (route=likes_batch_read, address)
BATCH_DESCRIPTOR_VALUE = "likes_batch_read"
USER_DESCRIPTOR_KEY = "user_id"
IP_DESCRIPTOR_KEY = "remote_address"  # fixed by Envoy for the remote_address action

WRITE_CLUSTER = metric_names.GATEWAY_WRITE_CLUSTER  # the write SLI selects its stats by this name
READ_CLUSTER = metric_names.GATEWAY_READ_CLUSTER  # the read SLI selects its stats by this name
SAMPLER_CLUSTER = "hotkey_sampler"
RATELIMIT_CLUSTER = "ratelimit"
# the OpenTelemetry Collector's OTLP/gRPC listener: Envoy opens each request's root span (or a
# child of the caller's traceparent) and sends its spans there; the services' spans join it
# through the traceparent Envoy forwards
TRACING_CLUSTER = "otel_collector"
TRACING_SERVICE_NAME = "gateway"
JWKS_CLUSTER = "jwks"
# Gateway -> service mTLS: the gateway's own certificate (its client identity) and the CA the
# services' certificates chain to, both from the gateway's certificate Secret at
# EnvoyParams.upstream_tls_dir; static SDS secrets so a renewal is picked up without a restart
UPSTREAM_CLIENT_SECRET = "upstream_client"
UPSTREAM_CA_SECRET = "upstream_ca"
SERVICE_CLUSTERS = (WRITE_CLUSTER, READ_CLUSTER, SAMPLER_CLUSTER)
# Prometheus scrapes Envoy's own series through a listener of their own that serves
# STATS_PATH and nothing else, relayed to the admin interface on loopback: the admin port itself
# (runtime writes, /quitquitquit) never leaves the pod.
HTTPS_LISTENER = "https"  # the API; listed first in the bootstrap
STATS_LISTENER = "stats"
STATS_PATH = "/stats/prometheus"
ADMIN_CLUSTER = "envoy_admin"

# The route that refuses a token whose subject the services would refuse (see _routes), and its
# answer: the services' error shape (services/common/http.error_body), their code for it
INVALID_SUBJECT_ROUTE = "likes_write_invalid_subject"
INVALID_SUBJECT_BODY = {
    "error": {
        "code": "invalid_subject",
        "message": f"the token's subject must match {keys.USER_ID_PATTERN}",
    }
}
# Envoy's own 5xx (no healthy upstream, a refused connection, an upstream timeout or overflow)
# answered as the services answer theirs (invariant 5: fail closed, never a bare 5xx): 503 with
# Retry-After and the services' error shape. A write the gateway gave up on may have been
# accepted: the client retries with the same Idempotency-Key, which makes the retry safe either
# way, and the body says so. What Envoy saw is kept in `details` (%RESPONSE_CODE_DETAILS%) and
# `flags`, and the access log keeps the status Envoy first chose.
GATEWAY_UNAVAILABLE_CODE = "gateway_upstream_unavailable"
GATEWAY_RETRY_AFTER_S = 1
# The largest regex program Envoy compiles (its runtime's default is 100 instructions)
RE2_MAX_PROGRAM_SIZE = 2048
# The limiter's failure mode: a choice, documented in infra/README.md, that tests pin
FAIL_OPEN = True

_HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@dataclass(frozen=True)
class EnvoyParams:
    """What differs between gateways; upstreams are `host:port` (headless Services, so that
    STRICT_DNS sees every pod and outlier detection can eject one)."""

    listener_port: int
    write_upstream: str
    read_upstream: str
    sampler_upstream: str
    ratelimit_upstream: str
    ratelimit_domain: str
    mirror_percent: float  # 1.0 means 1% of reads
    jwt_issuer: str
    jwks_uri: str
    tls_secret_name: str
    jwt_audiences: tuple[str, ...] = ()
    user_id_header: str = "x-user-id"
    # Behind Cloudflare the peer is a Cloudflare edge; the client is in CF-Connecting-IP. Empty:
    # the TCP peer is the client. Only safe if the origin accepts Cloudflare's ranges alone.
    client_ip_header: str = "CF-Connecting-IP"
    tls_cert_dir: str = "/etc/envoy/tls"  # the Kubernetes TLS secret, mounted (tls.crt, tls.key)
    # the gateway's internal certificate (ca.crt, tls.crt, tls.key): mTLS to our services
    upstream_tls_dir: str = tls.MOUNT_DIR
    ca_bundle: str = "/etc/ssl/certs/ca-certificates.crt"  # roots the JWKS fetch trusts
    admin_port: int = 9901
    stats_port: int = 9902  # STATS_LISTENER: STATS_PATH only, for Prometheus
    # host:port of the OTel Collector's OTLP/gRPC listener; None: the gateway makes no spans
    otlp_upstream: str | None = None
    # the share of reads the gateway traces, whatever the caller's traceparent says:
    # otel_config.READ_TRACE_PERCENT
    read_trace_percent: float = otel_config.READ_TRACE_PERCENT
    ratelimit_timeout_ms: int = 50
    write_timeout_s: float = 5.0
    read_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("listener_port", "admin_port", "stats_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ValueError(f"{name}: {port} is not a TCP port")
        if self.listener_port == self.admin_port:
            raise ValueError("admin_port: must differ from listener_port")
        if self.stats_port in (self.listener_port, self.admin_port):
            raise ValueError("stats_port: must differ from listener_port and admin_port")
        for name in ("write_upstream", "read_upstream", "sampler_upstream", "ratelimit_upstream"):
            _host_port(getattr(self, name), name)
        if self.otlp_upstream is not None:
            _host_port(self.otlp_upstream, "otlp_upstream")
        if not 0.0 <= self.mirror_percent <= 100.0:
            raise ValueError(f"mirror_percent: {self.mirror_percent} is not within 0..100")
        _fraction(self.mirror_percent, "mirror_percent")
        if not 0.0 <= self.read_trace_percent <= 100.0:
            raise ValueError(f"read_trace_percent: {self.read_trace_percent} is not within 0..100")
        _fraction(self.read_trace_percent, "read_trace_percent")
        if urlsplit(self.jwks_uri).scheme != "https" or not urlsplit(self.jwks_uri).hostname:
            raise ValueError(f"jwks_uri: {self.jwks_uri!r} is not an https URL")
        for name in ("ratelimit_domain", "jwt_issuer", "tls_secret_name", "user_id_header"):
            if not getattr(self, name):
                raise ValueError(f"{name}: must not be empty")


def _host_port(value: str, name: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name}: {value!r} is not host:port")
    return host, int(port)


def _fraction(percent: float, name: str) -> FractionalPercent:
    """Whole percents stay in HUNDRED (1% reads as 1/100); finer ones need MILLION."""
    if float(percent).is_integer():
        return FractionalPercent(
            numerator=int(percent), denominator=FractionalPercentDenominatorType.HUNDRED
        )
    per_million = percent * 10_000
    if not math.isclose(per_million, round(per_million)):
        raise ValueError(f"{name}: {percent} is finer than one per million")
    return FractionalPercent(
        numerator=round(per_million), denominator=FractionalPercentDenominatorType.MILLION
    )


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def _address(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def _typed(name: str, message: betterproto2.Message) -> TypedExtensionConfig:
    return TypedExtensionConfig(name=name, typed_config=Any.pack(message))


def _cluster(
    name: str,
    upstream: str,
    *,
    http2: bool = False,
    tls_sni: str | None = None,
    ca_bundle: str = "",
    eject_failing_hosts: bool = True,
    mtls: bool = False,
) -> Cluster:
    host, port = _host_port(upstream, name)
    cluster = Cluster(
        name=name,
        type=ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=_seconds(1),
        lb_policy=ClusterLbPolicy.LEAST_REQUEST,
        dns_lookup_family=ClusterDnsLookupFamily.V4_PREFERRED,
        load_assignment=ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=_address(host, port)))]
                )
            ],
        ),
    )
    if eject_failing_hosts:
        # the seed's "pod crash: LB ejects within 5 s". consecutive_5xx keeps Envoy's default (5):
        # betterproto2 spells it `consecutive5Xx` in JSON, which neither Envoy nor from_dict reads
        cluster.outlier_detection = OutlierDetection(
            consecutive_gateway_failure=3,
            interval=_seconds(5),
            base_ejection_time=_seconds(30),
            max_ejection_percent=50,
        )
    if http2:
        options = HttpProtocolOptions(
            explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
                http2_protocol_options=Http2ProtocolOptions()
            )
        )
        cluster.typed_extension_protocol_options = {_HTTP_PROTOCOL_OPTIONS: Any.pack(options)}
    if mtls:
        # gateway -> service mTLS: present the gateway's certificate; accept only a service
        # certificate from the platform CA that names the Service dialled
        cluster.transport_socket = TransportSocket(
            name="envoy.transport_sockets.tls",
            typed_config=Any.pack(
                UpstreamTlsContext(
                    sni=host,
                    common_tls_context=CommonTlsContext(
                        tls_params=TlsParameters(
                            tls_minimum_protocol_version=TlsParametersTlsProtocol.TLSv1_2
                        ),
                        tls_certificate_sds_secret_configs=[
                            SdsSecretConfig(name=UPSTREAM_CLIENT_SECRET)
                        ],
                        combined_validation_context=CommonTlsContextCombinedCertificateValidationContext(
                            default_validation_context=CertificateValidationContext(
                                match_typed_subject_alt_names=[_dns_san(host)]
                            ),
                            validation_context_sds_secret_config=SdsSecretConfig(
                                name=UPSTREAM_CA_SECRET
                            ),
                        ),
                    ),
                )
            ),
        )
    if tls_sni is not None:
        # verify the peer against the system roots and the host name: a forged JWKS would let
        # anyone mint tokens
        tls = UpstreamTlsContext(
            sni=tls_sni,
            common_tls_context=CommonTlsContext(
                validation_context=CertificateValidationContext(
                    # system_root_certs is gRPC-only (Envoy refuses SAN checks without a CA)
                    trusted_ca=DataSource(filename=ca_bundle),
                    match_typed_subject_alt_names=[_dns_san(tls_sni)],
                )
            ),
        )
        cluster.transport_socket = TransportSocket(
            name="envoy.transport_sockets.tls", typed_config=Any.pack(tls)
        )
    return cluster


def _dns_san(name: str) -> SubjectAltNameMatcher:
    return SubjectAltNameMatcher(
        san_type=SubjectAltNameMatcherSanType.DNS, matcher=StringMatcher(exact=name)
    )


def _method(method: str) -> HeaderMatcher:
    return HeaderMatcher(name=":method", string_match=StringMatcher(exact=method))


def _write_match() -> RouteMatch:
    return RouteMatch(path=WRITE_PATH, headers=[_method("POST")])


def _write_rate_limits(params: EnvoyParams) -> list[RateLimit]:
    route_key = RateLimitAction(
        generic_key=RateLimitActionGenericKey(
            descriptor_key=ROUTE_DESCRIPTOR_KEY, descriptor_value=WRITE_DESCRIPTOR_VALUE
        )
    )
    per_user = RateLimitAction(
        request_headers=RateLimitActionRequestHeaders(
            header_name=params.user_id_header, descriptor_key=USER_DESCRIPTOR_KEY
        )
    )
    per_ip = RateLimitAction(remote_address=RateLimitActionRemoteAddress())
    return [RateLimit(actions=[route_key, per_user]), RateLimit(actions=[route_key, per_ip])]


def _batch_rate_limits() -> list[RateLimit]:
    route_key = RateLimitAction(
        generic_key=RateLimitActionGenericKey(
            descriptor_key=ROUTE_DESCRIPTOR_KEY, descriptor_value=BATCH_DESCRIPTOR_VALUE
        )
    )
    return [
        RateLimit(
            actions=[route_key, RateLimitAction(remote_address=RateLimitActionRemoteAddress())]
        )
    ]


def _read_action(params: EnvoyParams, rate_limits: list[RateLimit] | None = None) -> RouteAction:
    return RouteAction(
        rate_limits=rate_limits or [],
        cluster=READ_CLUSTER,
        timeout=_seconds(params.read_timeout_s),
        # reads are safe to retry; the read service answers stale rather than 5xx anyway
        retry_policy=RetryPolicy(retry_on="5xx,reset,connect-failure", num_retries=1),
        request_mirror_policies=[
            RouteActionRequestMirrorPolicy(
                cluster=SAMPLER_CLUSTER,
                runtime_fraction=RuntimeFractionalPercent(
                    default_value=_fraction(params.mirror_percent, "mirror_percent"),
                    runtime_key=MIRROR_RUNTIME_KEY,
                ),
            )
        ],
    )


def _routes(params: EnvoyParams) -> RouteConfiguration:
    write = Route(
        name="likes_write",
        match=_write_match(),
        route=RouteAction(
            cluster=WRITE_CLUSTER,
            timeout=_seconds(params.write_timeout_s),
            # only failures before the request reached a pod: a replay is deduped by the
            # Idempotency-Key anyway, but retrying a 503 would add load to a failing store
            retry_policy=RetryPolicy(retry_on="connect-failure,refused-stream", num_retries=2),
            rate_limits=_write_rate_limits(params),
        ),
    )
    # reads are head-sampled: a trace starts for this share of them (otel_config)
    read_tracing = Tracing(
        random_sampling=_fraction(params.read_trace_percent, "read_trace_percent")
    )
    read = Route(
        name="post_likes_read",
        match=RouteMatch(safe_regex=RegexMatcher(regex=READ_PATH_REGEX), headers=[_method("GET")]),
        route=_read_action(params),
        tracing=read_tracing,
    )
    batch = Route(
        name="post_likes_batch_read",
        # a read although a POST (the ids are a body); mirrored like the single read
        match=RouteMatch(path=BATCH_READ_PATH, headers=[_method("POST")]),
        route=_read_action(params, _batch_rate_limits()),
        tracing=read_tracing,
    )
    # A token's `sub` becomes the per-user descriptor, a key in the limiter's Redis, before any
    # service sees it: one outside the services' own rule (keys.USER_ID_PATTERN: bounded, no
    # characters that break a key) is refused here, before the limiter runs (jwt_authn clears
    # the route cache after setting the header, so this route is chosen then, and it has no
    # rate limits). A token without `sub` sets no header: the write route, and the service's 401.
    bad_subject = Route(
        name=INVALID_SUBJECT_ROUTE,
        match=RouteMatch(
            path=WRITE_PATH,
            headers=[
                _method("POST"),
                HeaderMatcher(
                    name=params.user_id_header,
                    string_match=StringMatcher(safe_regex=RegexMatcher(regex=keys.USER_ID_PATTERN)),
                    invert_match=True,
                ),
            ],
        ),
        direct_response=DirectResponseAction(
            status=401,
            body=DataSource(inline_string=json.dumps(INVALID_SUBJECT_BODY)),
            body_format=SubstitutionFormatString(
                text_format_source=DataSource(inline_string="%LOCAL_REPLY_BODY%"),
                content_type="application/json",
            ),
        ),
    )
    wrong_method = Route(
        name="likes_method_not_allowed",
        match=RouteMatch(path=WRITE_PATH),
        direct_response=DirectResponseAction(status=405),
    )
    return RouteConfiguration(
        name="likes",
        virtual_hosts=[
            VirtualHost(
                name="likes",
                domains=["*"],
                routes=[bad_subject, write, read, batch, wrong_method],
            )
        ],
    )


def _jwt_filter(params: EnvoyParams) -> JwtAuthentication:
    provider = JwtProvider(
        issuer=params.jwt_issuer,
        audiences=list(params.jwt_audiences),
        remote_jwks=RemoteJwks(
            http_uri=HttpUri(uri=params.jwks_uri, cluster=JWKS_CLUSTER, timeout=_seconds(2)),
            cache_duration=_seconds(600),
            # fetch at startup, so the first write after a deploy does not wait on the IdP
            async_fetch=JwksAsyncFetch(fast_listener=False),
        ),
        # the services verify the token too (defence in depth) and read has_liked from it
        forward=True,
        claim_to_headers=[JwtClaimToHeader(header_name=params.user_id_header, claim_name="sub")],
        # routes are chosen again once the header is set: INVALID_SUBJECT_ROUTE matches on it
        clear_route_cache=True,
    )
    required = JwtRequirement(provider_name=JWT_PROVIDER)
    # reads: a valid token gives has_liked, no token is anonymous, a bad token is still a 401
    optional = JwtRequirement(
        requires_any=JwtRequirementOrList(
            requirements=[required, JwtRequirement(allow_missing=Empty())]
        )
    )
    return JwtAuthentication(
        providers={JWT_PROVIDER: provider},
        rules=[
            RequirementRule(match=_write_match(), requires=required),
            RequirementRule(match=RouteMatch(prefix="/"), requires=optional),
        ],
    )


def _ratelimit_filter(params: EnvoyParams) -> RateLimitFilter:
    return RateLimitFilter(
        domain=params.ratelimit_domain,
        # fail open, by choice (infra/README.md, "Rate limits at the gateway"): a ratelimit
        # outage must not stop every like; Envoy counts what it let through
        failure_mode_deny=not FAIL_OPEN,
        timeout=datetime.timedelta(milliseconds=params.ratelimit_timeout_ms),
        enable_x_ratelimit_headers=RateLimitXRateLimitHeadersRfcVersion.DRAFT_VERSION_03,
        rate_limit_service=RateLimitServiceConfig(
            grpc_service=GrpcService(
                envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=RATELIMIT_CLUSTER)
            ),
            transport_api_version=ApiVersion.V3,
        ),
    )


def _access_log() -> AccessLog:
    fields = {
        "start_time": "%START_TIME%",
        "method": "%REQ(:METHOD)%",
        "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
        "protocol": "%PROTOCOL%",
        "response_code": "%RESPONSE_CODE%",
        "response_flags": "%RESPONSE_FLAGS%",
        "duration_ms": "%DURATION%",
        "upstream_service_time_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
        "upstream_cluster": "%UPSTREAM_CLUSTER%",
        "upstream_host": "%UPSTREAM_HOST%",
        "client_ip": "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "traceparent": "%REQ(TRACEPARENT)%",
        "user_agent": "%REQ(USER-AGENT)%",
        "bytes_received": "%BYTES_RECEIVED%",
        "bytes_sent": "%BYTES_SENT%",
    }
    log_format = SubstitutionFormatString(
        json_format=Struct(fields={k: Value(string_value=v) for k, v in fields.items()})
    )
    return AccessLog(
        name="envoy.access_loggers.stdout",
        typed_config=Any.pack(StdoutAccessLog(log_format=log_format)),
    )


def _local_reply_config() -> LocalReplyConfig:
    """Envoy's own 5xx as a clean 503 (GATEWAY_UNAVAILABLE_CODE above). Only local replies pass
    through these mappers: a service's own answer, 5xx or not, reaches the client untouched, and
    so do Envoy's 4xx (401 from jwt_authn, 429 from the limiter: their bodies are their own)."""
    error = {
        "code": Value(string_value=GATEWAY_UNAVAILABLE_CODE),
        "message": Value(
            string_value="the gateway got no answer from the service: "
            "retry after Retry-After (a write with the same Idempotency-Key)"
        ),
        "details": Value(string_value="%RESPONSE_CODE_DETAILS%"),
        "flags": Value(string_value="%RESPONSE_FLAGS%"),
    }
    body = Struct(fields={"error": Value(struct_value=Struct(fields=error))})
    return LocalReplyConfig(
        mappers=[
            ResponseMapper(
                filter=AccessLogFilter(
                    status_code_filter=StatusCodeFilter(
                        comparison=ComparisonFilter(
                            op=ComparisonFilterOp.GE,
                            value=RuntimeUInt32(default_value=500, runtime_key="local_reply_5xx"),
                        )
                    )
                ),
                status_code=503,
                headers_to_add=[
                    HeaderValueOption(
                        header=HeaderValue(key="Retry-After", value=str(GATEWAY_RETRY_AFTER_S)),
                        append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
                    )
                ],
                body_format_override=SubstitutionFormatString(
                    json_format=body, content_type="application/json"
                ),
            )
        ]
    )


def _http_connection_manager(params: EnvoyParams) -> HttpConnectionManager:
    hcm = HttpConnectionManager(
        stat_prefix="ingress_https",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        route_config=_routes(params),
        # jwt_authn first: it sets the user header the ratelimit descriptors read
        http_filters=[
            HttpFilter(
                name="envoy.filters.http.jwt_authn", typed_config=Any.pack(_jwt_filter(params))
            ),
            HttpFilter(
                name="envoy.filters.http.ratelimit",
                typed_config=Any.pack(_ratelimit_filter(params)),
            ),
            HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(Router())),
        ],
        # a client-sent user header must never pass for a verified identity: strip it before any
        # filter runs (jwt_authn sets it from the token). Envoy 1.40's jwt_authn clears it too;
        # this keeps it so on older builds and whatever the filter's config becomes
        early_header_mutation_extensions=[
            _typed(
                "envoy.http.early_header_mutation.header_mutation",
                EarlyHeaderMutation(mutations=[HeaderMutation(remove=params.user_id_header)]),
            )
        ],
        # route and JWT rules match on the normalised path: //v1/likes or %2F cannot dodge them
        normalize_path=True,
        merge_slashes=True,
        path_with_escaped_slashes_action=HttpConnectionManagerPathWithEscapedSlashesAction.REJECT_REQUEST,
        request_headers_timeout=_seconds(10),
        stream_idle_timeout=_seconds(30),
        access_log=[_access_log()],
        local_reply_config=_local_reply_config(),
    )
    if params.otlp_upstream is not None:
        # every write is traced here and READ_TRACE_PERCENT of reads (the routes' tracing);
        # the collector's tail sampling decides what is kept. A caller's traceparent gives the
        # trace its parent but not its sampling: the traceparent Envoy sends upstream carries
        # Envoy's decision, which the services continue, so no client can force the read path
        # to trace (checked on the stack: a sampled traceparent on a read leaves no span)
        hcm.tracing = HttpConnectionManagerTracing(
            provider=TracingHttp(
                name="envoy.tracers.opentelemetry",
                typed_config=Any.pack(
                    OpenTelemetryConfig(
                        grpc_service=GrpcService(
                            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=TRACING_CLUSTER),
                            timeout=_seconds(1),
                        ),
                        service_name=TRACING_SERVICE_NAME,
                    )
                ),
            )
        )
    # Envoy refuses use_remote_address together with a detection extension
    if not params.client_ip_header:
        hcm.use_remote_address = True
    else:
        hcm.original_ip_detection_extensions = [
            _typed(
                "envoy.http.original_ip_detection.custom_header",
                CustomHeaderConfig(header_name=params.client_ip_header),
            )
        ]
    return hcm


def _listener(params: EnvoyParams) -> Listener:
    tls = DownstreamTlsContext(
        common_tls_context=CommonTlsContext(
            tls_params=TlsParameters(tls_minimum_protocol_version=TlsParametersTlsProtocol.TLSv1_2),
            # names the static secret below; an SDS server could serve the same name later
            tls_certificate_sds_secret_configs=[SdsSecretConfig(name=params.tls_secret_name)],
            alpn_protocols=["h2", "http/1.1"],
        )
    )
    return Listener(
        name=HTTPS_LISTENER,
        address=_address("0.0.0.0", params.listener_port),
        filter_chains=[
            FilterChain(
                filters=[_hcm_filter(_http_connection_manager(params))],
                transport_socket=TransportSocket(
                    name="envoy.transport_sockets.tls", typed_config=Any.pack(tls)
                ),
            )
        ],
    )


def _stats_listener(params: EnvoyParams) -> Listener:
    """STATS_PATH (GET) relayed to the admin interface; any other request is a 404 here."""
    stats = Route(
        name="prometheus_stats",
        match=RouteMatch(path=STATS_PATH, headers=[_method("GET")]),
        route=RouteAction(cluster=ADMIN_CLUSTER, timeout=_seconds(10)),
    )
    refuse = Route(match=RouteMatch(prefix="/"), direct_response=DirectResponseAction(status=404))
    hcm = HttpConnectionManager(
        stat_prefix=STATS_LISTENER,
        codec_type=HttpConnectionManagerCodecType.AUTO,
        route_config=RouteConfiguration(
            name=STATS_LISTENER,
            virtual_hosts=[VirtualHost(name=STATS_LISTENER, domains=["*"], routes=[stats, refuse])],
        ),
        http_filters=[
            HttpFilter(name="envoy.filters.http.router", typed_config=Any.pack(Router()))
        ],
        request_headers_timeout=_seconds(10),
    )
    return Listener(
        name=STATS_LISTENER,
        address=_address("0.0.0.0", params.stats_port),
        filter_chains=[FilterChain(filters=[_hcm_filter(hcm)])],
    )


def _hcm_filter(hcm: HttpConnectionManager) -> Filter:
    return Filter(name="envoy.filters.network.http_connection_manager", typed_config=Any.pack(hcm))


def _admin_cluster(params: EnvoyParams) -> Cluster:
    """The admin interface on loopback, for the stats listener alone."""
    return Cluster(
        name=ADMIN_CLUSTER,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_seconds(1),
        load_assignment=ClusterLoadAssignment(
            cluster_name=ADMIN_CLUSTER,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[
                        LbEndpoint(
                            endpoint=Endpoint(address=_address("127.0.0.1", params.admin_port))
                        )
                    ]
                )
            ],
        ),
    )


def _tls_secrets(params: EnvoyParams) -> list[Secret]:
    def pair(name: str, cert_dir: str) -> Secret:
        return Secret(
            name=name,
            tls_certificate=TlsCertificate(
                certificate_chain=DataSource(filename=f"{cert_dir}/{tls.CERT_KEY}"),
                private_key=DataSource(filename=f"{cert_dir}/{tls.KEY_KEY}"),
                # Kubernetes swaps the mounted secret atomically; reload the pair when it rotates
                watched_directory=WatchedDirectory(path=cert_dir),
            ),
        )

    upstream = params.upstream_tls_dir.rstrip("/")
    return [
        pair(params.tls_secret_name, params.tls_cert_dir.rstrip("/")),
        pair(UPSTREAM_CLIENT_SECRET, upstream),
        Secret(
            name=UPSTREAM_CA_SECRET,
            validation_context=CertificateValidationContext(
                trusted_ca=DataSource(filename=f"{upstream}/{tls.CA_KEY}"),
                watched_directory=WatchedDirectory(path=upstream),
            ),
        ),
    ]


def bootstrap_message(params: EnvoyParams) -> Bootstrap:
    """The typed Bootstrap (for callers that want the objects rather than JSON)."""
    jwks_host = urlsplit(params.jwks_uri).hostname or ""
    jwks_port = urlsplit(params.jwks_uri).port or 443
    return Bootstrap(
        node=Node(cluster="likes-gateway"),
        admin=Admin(address=_address("127.0.0.1", params.admin_port)),
        # the admin layer lets on-call change the mirror fraction without a deploy
        layered_runtime=LayeredRuntime(
            layers=[
                RuntimeLayer(
                    name="static",
                    static_layer=Struct(
                        fields={
                            # RE2 refuses programs over 100 instructions by default: the
                            # subject rule's bounded repeat ({1,128}) compiles to ~1000
                            "re2.max_program_size.error_level": Value(
                                number_value=RE2_MAX_PROGRAM_SIZE
                            )
                        }
                    ),
                ),
                RuntimeLayer(name="admin", admin_layer=RuntimeLayerAdminLayer()),
            ]
        ),
        static_resources=BootstrapStaticResources(
            listeners=[_listener(params), _stats_listener(params)],
            clusters=[
                _cluster(WRITE_CLUSTER, params.write_upstream, mtls=True),
                _cluster(READ_CLUSTER, params.read_upstream, mtls=True),
                # mirrored traffic is fire-and-forget; never eject on its answers
                _cluster(
                    SAMPLER_CLUSTER,
                    params.sampler_upstream,
                    eject_failing_hosts=False,
                    mtls=True,
                ),
                _cluster(RATELIMIT_CLUSTER, params.ratelimit_upstream, http2=True),
                _cluster(
                    JWKS_CLUSTER,
                    f"{jwks_host}:{jwks_port}",
                    tls_sni=jwks_host,
                    ca_bundle=params.ca_bundle,
                    eject_failing_hosts=False,
                ),
                *(
                    [
                        # spans are best effort: never eject, never hold a request for them
                        _cluster(
                            TRACING_CLUSTER,
                            params.otlp_upstream,
                            http2=True,
                            eject_failing_hosts=False,
                        )
                    ]
                    if params.otlp_upstream is not None
                    else []
                ),
                _admin_cluster(params),
            ],
            secrets=_tls_secrets(params),
        ),
    )


def build_bootstrap(params: EnvoyParams) -> dict[str, JsonAny]:
    """The Envoy v3 Bootstrap as proto3 JSON, ready for `envoy -c bootstrap.json`."""
    return bootstrap_message(params).to_dict()


def ratelimit_service_config(
    domain: str,
    per_user_per_min: int = 100,
    per_ip_per_min: int = 1000,
    per_ip_batch_reads_per_min: int = 600,
) -> dict[str, JsonAny]:
    """envoyproxy/ratelimit's config: the seed's per-user and per-IP write limits, nested under the
    write route's generic key exactly as `_write_rate_limits` sends them, and the per-IP limit of
    the batch read under its own key (`_batch_rate_limits`)."""
    if min(per_user_per_min, per_ip_per_min, per_ip_batch_reads_per_min) <= 0:
        raise ValueError("rate limits must be positive")

    def limit(key: str, per_minute: int) -> dict[str, JsonAny]:
        return {"key": key, "rate_limit": {"unit": "minute", "requests_per_unit": per_minute}}

    return {
        "domain": domain,
        "descriptors": [
            {
                "key": ROUTE_DESCRIPTOR_KEY,
                "value": WRITE_DESCRIPTOR_VALUE,
                "descriptors": [
                    limit(USER_DESCRIPTOR_KEY, per_user_per_min),
                    limit(IP_DESCRIPTOR_KEY, per_ip_per_min),
                ],
            },
            {
                "key": ROUTE_DESCRIPTOR_KEY,
                "value": BATCH_DESCRIPTOR_VALUE,
                "descriptors": [limit(IP_DESCRIPTOR_KEY, per_ip_batch_reads_per_min)],
            },
        ],
    }
