"""Prometheus and Alertmanager from Debian's packages, running the configs the Pulumi program
renders (local/rendered.py) through the explicit local transforms
(local/observability_transforms.py); what Alertmanager sends lands in a local webhook sink. The
OpenTelemetry Collector, built by local/setup.sh, runs the rendered tail-sampling tier
(local/otelcol.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from infra import exporters, otel_config, platform
from infra import observability as obs
from local import observability_render, otelcol
from local import observability_transforms as transforms
from local.components.base import Component, MissingBinary, Server, http_probe
from local.layout import HOST, REPO_ROOT, Layout


def _write_if_changed(path: Path, text: str) -> bool:
    """Replace the file whole (a temporary file renamed over it): Prometheus's file SD watches
    these files and once read one half written ("unexpected end of JSON input")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def _reload(url: str) -> None:
    httpx.post(f"{url}/-/reload", timeout=10).raise_for_status()


class Alertmanager(Component):
    name = "alertmanager"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.alertmanager}"

    @property
    def sink_url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.webhook_sink}"

    @property
    def config_path(self) -> Path:
        return self.layout.conf / obs.ALERTMANAGER_CONFIG_FILE

    def servers(self) -> list[Server]:
        argv = [
            shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager",
            f"--config.file={self.config_path}",
            f"--storage.path={self.layout.data / 'alertmanager'}",
            f"--web.listen-address={HOST}:{self.layout.ports.alertmanager}",
            "--cluster.listen-address=",  # no HA gossip locally
        ]
        pythonpath = os.pathsep.join(x for x in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if x)
        sink = [
            sys.executable, "-m", "local.webhook_sink", "--host", HOST,
            "--port", str(self.layout.ports.webhook_sink),
            "--store", str(self.layout.data / "webhook-sink" / "notifications.jsonl"),
        ]  # fmt: skip
        return [
            Server(
                name="webhook-sink",
                argv=sink,
                address=self.sink_url,
                probe=lambda: http_probe(f"{self.sink_url}/-/ready"),
                env={"PYTHONPATH": pythonpath},
                start_timeout=30,
                stop_timeout=5,
            ),
            Server(
                name="alertmanager",
                argv=argv,
                address=self.url,
                probe=lambda: http_probe(f"{self.url}/-/ready"),
                start_timeout=30,
                stop_timeout=10,
            ),
        ]

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.alertmanager}"]

    def config(self) -> str:
        cfg = transforms.alertmanager(observability_render.load(self.layout.stack), self.sink_url)
        return yaml.safe_dump(cfg, sort_keys=False)

    def prepare(self) -> None:
        self.layout.ensure()
        _write_if_changed(self.config_path, self.config())

    def bootstrap(self) -> None:
        # the program changed since Alertmanager started: load the new render
        if _write_if_changed(self.config_path, self.config()):
            _reload(self.url)


class OtelCollector(Component):
    """Every workload's and the gateway's spans arrive here (OTLP): the rendered sampler tier,
    which keeps what its tail-sampling policies keep and exports it to Tempo through its disk
    queue. Tempo is a second run of the same binary (server `tempo`) that writes what it
    receives to `traces_file` (OTLP JSON lines); `likes local stop tempo` is a Tempo outage."""

    name = otel_config.COLLECTOR  # what every exporter dials
    plays = otel_config.SAMPLER  # whose config, pod labels and metrics it has
    TEMPO = "tempo"  # the stand-in's server name

    @property
    def binary(self) -> Path:
        return self.layout.cache / "bin" / otelcol.BINARY

    @property
    def data_dir(self) -> Path:
        return self.layout.data / "otel"

    @property
    def tempo_dir(self) -> Path:
        return self.layout.data / self.TEMPO

    @property
    def traces_file(self) -> Path:
        return self.tempo_dir / otelcol.TRACES_FILE

    @property
    def config_path(self) -> Path:
        return self.layout.conf / "otelcol.yaml"

    @property
    def tempo_config_path(self) -> Path:
        return self.layout.conf / "tempo.yaml"

    @property
    def health_url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.otel_health}"

    @property
    def tempo_health_url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.tempo_health}"

    def servers(self) -> list[Server]:
        if not self.binary.exists():
            raise MissingBinary(f"{self.binary} is missing: run local/setup.sh")
        return [
            self._server(self.TEMPO, self.tempo_config_path, self.layout.ports.tempo_grpc,
                         self.tempo_health_url),
            self._server(self.name, self.config_path, self.layout.ports.otel_http,
                         self.health_url),
        ]  # fmt: skip

    def _server(self, name: str, config: Path, port: int, health_url: str) -> Server:
        """The collector binary running one config: the sampler, or the Tempo stand-in."""
        return Server(
            name=name,
            argv=[str(self.binary), f"--config={config}"],
            address=f"{HOST}:{port}",
            probe=lambda: http_probe(f"{health_url}/"),
            start_timeout=30,
            stop_timeout=10,
        )

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.otel_metrics}"]

    def config(self) -> str:
        p = self.layout.ports
        cfg = otelcol.collector_config(
            observability_render.load(self.layout.stack).collector,
            grpc_port=p.otel_grpc,
            http_port=p.otel_http,
            health_port=p.otel_health,
            metrics_port=p.otel_metrics,
            tempo_port=p.tempo_grpc,
            data_dir=self.data_dir,
        )
        return yaml.safe_dump(cfg, sort_keys=False)

    def tempo_config(self) -> str:
        p = self.layout.ports
        cfg = otelcol.tempo_config(
            grpc_port=p.tempo_grpc, health_port=p.tempo_health, data_dir=self.tempo_dir
        )
        return yaml.safe_dump(cfg, sort_keys=False)

    def prepare(self) -> None:
        self.layout.ensure()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tempo_dir.mkdir(parents=True, exist_ok=True)
        _write_if_changed(self.config_path, self.config())
        _write_if_changed(self.tempo_config_path, self.tempo_config())


class Prometheus(Component):
    name = "prometheus"

    def __init__(self, layout: Layout, targets: Callable[[], dict[str, list[str]]]) -> None:
        super().__init__(layout)
        self._targets = targets  # component name -> host:port list, read when the config is written

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.prometheus}"

    @property
    def config_path(self) -> Path:
        return self.layout.conf / obs.PROMETHEUS_CONFIG_FILE

    def servers(self) -> list[Server]:
        argv = [
            shutil.which("prometheus") or "/usr/bin/prometheus",
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.layout.data / 'prometheus'}",
            f"--web.listen-address={HOST}:{self.layout.ports.prometheus}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=2d",
            "--rules.alert.resend-delay=5s",  # the default 1m makes a fresh stack look silent
        ]
        return [
            Server(
                name="prometheus",
                argv=argv,
                address=self.url,
                probe=lambda: http_probe(f"{self.url}/-/ready"),
                start_timeout=30,
                stop_timeout=10,
            )
        ]

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.prometheus}"]

    def addresses(self) -> dict[str, str]:
        """In-cluster address -> the local server that plays it (transform 2)."""
        am = obs.in_cluster("alertmanager", platform.NS_OBSERVABILITY, obs.ALERTMANAGER_PORT)
        exporter = obs.in_cluster(
            exporters.REDIS_EXPORTER, platform.NS_DATA, exporters.REDIS_EXPORTER_PORT
        )
        return {
            am: f"{HOST}:{self.layout.ports.alertmanager}",
            exporter: f"{HOST}:{self.layout.ports.redis_exporter}",
        }

    def _write(self) -> bool:
        """Write config, rules and targets; True when Prometheus must reload to see them."""
        r = observability_render.load(self.layout.stack)
        rules_dir = self.layout.conf / "rules"
        cfg, files = transforms.prometheus(
            r, self._targets(), self.addresses(), rules_dir, self.layout.conf / "targets"
        )
        changed = _write_if_changed(self.config_path, yaml.safe_dump(cfg, sort_keys=False))
        if rules_dir.exists():
            for old in rules_dir.glob("*.yml"):
                if old.name not in r.rules:
                    old.unlink()
                    changed = True
        for name, text in r.rules.items():
            changed |= _write_if_changed(rules_dir / name, transforms.rules(text, r.prometheus))
        for path, groups in files.items():
            _write_if_changed(path, json.dumps(groups, indent=1))  # file_sd watches it
        return changed

    def prepare(self) -> None:
        self.layout.ensure()
        self._write()

    def bootstrap(self) -> None:
        if self._write():
            _reload(self.url)
