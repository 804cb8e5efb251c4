#!/usr/bin/env bash
# One setup path for a fresh machine, safe to rerun: Debian packages, the Python environment
# (.venv), and the Maven artifacts of Kafka, Cassandra and the JMX exporter agent. pip's and
# Maven's caches are reused.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# 1. Debian packages: the servers of the local stack and the JVM toolchain.
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
command -v etcd >/dev/null || need+=(etcd-server)
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v prometheus-redis-exporter >/dev/null || need+=(prometheus-redis-exporter)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v make >/dev/null || need+=(make)
command -v openssl >/dev/null || need+=(openssl)  # throwaway TLS certs for the Envoy tests
if [ ${#need[@]} -gt 0 ]; then
  say "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  # no service auto-start: the stack runs its own servers on its own ports
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
  # Debian may have started its own copies; they listen on default ports we do not use, but
  # they are not ours to keep running on a dev box
  for svc in redis-server etcd prometheus prometheus-alertmanager prometheus-redis-exporter; do
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  done
else
  say "Debian packages present"
fi

# 2. Python: one virtualenv with this repository installed editable, redone when pyproject moves.
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.likes-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing Python packages into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
else
  say "Python environment up to date"
fi

# 3. The OpenTelemetry Collector, built with the collector builder at the release the program
#    deploys (infra/otel_config.py) from the modules local/otelcol.py lists; skipped when the
#    binary was built from this exact manifest. It builds in the background while Maven resolves.
build_collector() {
  local version dir bin
  version=$(.venv/bin/python -c 'from infra import otel_config as o; print(o.COLLECTOR_VERSION)')
  dir=.cache/otelcol
  bin=.cache/bin/otelcol-likes
  mkdir -p "$dir" .cache/bin
  .venv/bin/python -m local.otelcol manifest "$dir/manifest.new.yaml"
  if [ -x "$bin" ] && cmp -s "$dir/manifest.new.yaml" "$dir/manifest.yaml"; then
    say "OpenTelemetry Collector $version present"
    rm "$dir/manifest.new.yaml"
    return 0
  fi
  say "building the OpenTelemetry Collector $version (collector builder, ~3 min on 2 cores)"
  rm -f "$dir/manifest.yaml"
  rm -rf "$dir/dist"
  if ! { GOBIN="$PWD/.cache/bin" go install "go.opentelemetry.io/collector/cmd/builder@v$version" \
      && .cache/bin/builder --config "$dir/manifest.new.yaml"; } >"$dir/build.log" 2>&1; then
    tail -n 30 "$dir/build.log" >&2
    return 1
  fi
  mv "$dir/dist/otelcol-likes" "$bin"
  mv "$dir/manifest.new.yaml" "$dir/manifest.yaml"
  rm -rf "$dir/dist"
  say "OpenTelemetry Collector $version built"
}
if ! command -v go >/dev/null; then
  echo "local/setup.sh: Go is needed to build the collector and the ratelimit service (https://go.dev/dl/)" >&2
  exit 1
fi
build_collector &
collector_build=$!

# 4. Maven: resolve the Kafka and Cassandra classpaths (jars land in ~/.m2, reused next time)
# and the JMX exporter agent both load.
say "resolving Kafka, Cassandra and the JMX exporter agent from Maven Central"
.venv/bin/python -m local.maven kafka cassandra
# go_install NAME MODULE PACKAGE VERSION GOBIN: `go install MODULE/PACKAGE@VERSION` into a
# repo-local GOBIN that survives `down --wipe`; skipped when that exact version is installed there.
go_install() {
  local name=$1 module=$2 package=$3 version=$4 gobin=$5
  local bin="$gobin/${package##*/}"
  if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null \
      | grep -qE "^[[:space:]]+mod[[:space:]]+$module[[:space:]]+$version[[:space:]]"; then
    say "$name $version present"
  else
    say "building $name $module@$version"
    mkdir -p "$gobin"
    GOBIN="$PWD/$gobin" go install "$module/$package@$version"
  fi
}
# 5. envoyproxy/ratelimit, built from the commit the program deploys (infra/gateway.py pins it).
go_install "the ratelimit service" github.com/envoyproxy/ratelimit src/service_cmd \
  "$(.venv/bin/python -c 'from infra import gateway as g; print(g.RATELIMIT_VERSION)')" .cache/bin
# 6. Toxiproxy, the --faults profile's proxies (local/components/toxiproxy.py pins the version).
go_install toxiproxy \
  "$(.venv/bin/python -c 'from local.components import toxiproxy as t; print(t.MODULE)')" cmd/server \
  "$(.venv/bin/python -c 'from local.components import toxiproxy as t; print(t.VERSION)')" \
  .cache/toxiproxy
wait "$collector_build" || { echo "local/setup.sh: the collector build failed" >&2; exit 1; }
say "setup done"
