"""Prometheus and Alertmanager from Debian's packages, with a scrape config generated from the
stack's own components (every component that serves /metrics lists itself)."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import httpx
import yaml

from local.components.base import Component, Server, http_probe
from local.layout import HOST, REPO_ROOT, Layout

RULES_DIR = REPO_ROOT / "local" / "prometheus" / "rules"
SCRAPE_INTERVAL = "5s"


class Alertmanager(Component):
    name = "alertmanager"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.alertmanager}"

    def servers(self) -> list[Server]:
        argv = [
            shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager",
            f"--config.file={self.layout.conf / 'alertmanager.yml'}",
            f"--storage.path={self.layout.data / 'alertmanager'}",
            f"--web.listen-address={HOST}:{self.layout.ports.alertmanager}",
            "--cluster.listen-address=",  # no HA gossip locally
        ]
        return [
            Server(
                name="alertmanager",
                argv=argv,
                address=self.url,
                probe=lambda: http_probe(f"{self.url}/-/ready"),
                start_timeout=30,
                stop_timeout=10,
            )
        ]

    def prepare(self) -> None:
        self.layout.ensure()
        config = {
            "route": {
                "receiver": "local",
                "group_by": ["alertname"],
                "group_wait": "1s",
                "group_interval": "5s",
                "repeat_interval": "5m",
            },
            # locally alerts are read with `amtool`/the API; production routes to the pager
            "receivers": [{"name": "local"}],
        }
        (self.layout.conf / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.alertmanager}"]


class Prometheus(Component):
    name = "prometheus"

    def __init__(self, layout: Layout, targets: Callable[[], dict[str, list[str]]]) -> None:
        super().__init__(layout)
        self._targets = targets  # job name -> host:port list, read when the config is written

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.prometheus}"

    def servers(self) -> list[Server]:
        argv = [
            shutil.which("prometheus") or "/usr/bin/prometheus",
            f"--config.file={self.layout.conf / 'prometheus.yml'}",
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

    def config(self) -> dict[str, object]:
        jobs = self._targets()  # includes this component's own metrics_targets()
        return {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(RULES_DIR / "*.yml")],
            "alerting": {
                "alertmanagers": [
                    {"static_configs": [{"targets": [f"{HOST}:{self.layout.ports.alertmanager}"]}]}
                ]
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
                if targets
            ],
        }

    def prepare(self) -> None:
        self.layout.ensure()
        (self.layout.conf / "prometheus.yml").write_text(
            yaml.safe_dump(self.config(), sort_keys=False)
        )

    def bootstrap(self) -> None:
        # targets change as components are added: rewrite and reload only when the config moved
        path = self.layout.conf / "prometheus.yml"
        new = yaml.safe_dump(self.config(), sort_keys=False)
        if path.read_text() != new:
            path.write_text(new)
            httpx.post(f"{self.url}/-/reload", timeout=5).raise_for_status()
