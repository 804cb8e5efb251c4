"""Our workloads as local processes, each started from its container as the Pulumi program
renders it for the stack (local/rendered.py), changed only by local/transforms.py."""

from __future__ import annotations

from local import observability_transforms as obs_transforms
from local import rendered, transforms
from local.components.base import Component, Server, http_probe
from local.components.gateway import Gateway
from local.layout import HOST, REPO_ROOT, Layout
from services.contracts import workloads

STORES = ("etcd", "idem-store", "count-cache", "kafka", "cassandra", "schema-registry")
# a store only some workloads use, by the settings field that names it (workloads.SERVERS)
STORES_BY_FIELD = {"feature_store_nodes": "feature-store"}


class Workload(Component):
    """One rendered workload: its command, env and probes, transformed for loopback."""

    def __init__(self, layout: Layout, process: transforms.Process) -> None:
        super().__init__(layout)
        self.process = process
        self.name = process.name
        w = process.workload
        self.requires = (*STORES, "hot-pools") if w.kind == "operator" else STORES
        self.requires += tuple(STORES_BY_FIELD[f] for f in w.uses if f in STORES_BY_FIELD)
        if "gateway_url" in w.uses:  # the canary calls the API through it
            self.requires = (*self.requires, Gateway.name)
        if process.sidecar is not None:  # the sidecar needs no store; its workload dials it
            self.requires = ()
        elif w.sidecar is not None:
            self.requires = (*self.requires, w.sidecar.name)

    def prepare(self) -> None:
        if self.process.sidecar is workloads.ABUSE_MODEL:
            _first_model(self.layout)

    @property
    def url(self) -> str:
        """The API (https with the gateway's mTLS in the --tls profile), a worker's ops port, or
        a sidecar's own port (the model server's gRPC)."""
        if self.process.sidecar is not None:
            return f"{HOST}:{self.process.port}"
        mtls = self.process.workload.kind == "http" and self.layout.tls
        return f"{'https' if mtls else 'http'}://{HOST}:{self.process.port}"

    @property
    def ops_url(self) -> str:
        """Probes and metrics: plain HTTP in both profiles, as in the cluster."""
        return f"http://{HOST}:{self.process.ops_port}"

    def servers(self) -> list[Server]:
        ready = f"{self.ops_url}{self.process.readiness_path}"
        return [
            Server(
                name=self.name,
                argv=self.process.argv,
                address=self.url,
                probe=lambda: http_probe(ready),
                env=self.process.env,
                inherit_env=False,  # a pod sees only its rendered env
                # the image's workdir holds the code: `python -m` imports this checkout's, not
                # whichever checkout the virtualenv was installed from
                cwd=REPO_ROOT,
                start_timeout=60,
                stop_timeout=10,
            )
        ]

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.process.ops_port}"]

    def scrape_targets(self) -> dict[str, list[str]]:
        """A sidecar's ops port is its workload's pod's port of that name (the pod's scrape
        annotations name the workload's own port)."""
        if self.process.sidecar is not None:
            key = obs_transforms.port_key(
                self.process.workload.name, workloads.SIDECAR_METRICS_PORT
            )
            return {key: self.metrics_targets()}
        return super().scrape_targets()


def _first_model(layout: Layout) -> None:
    """A first start trains the default model (what `likes abuse train` does, ~10 s), so the
    model server has one to serve; a stack that has one keeps it (and its `current`)."""
    from services.abuse import model  # scikit-learn: only when a model server starts

    if model.current_version(layout.abuse_models) is None:
        model.save(model.train(), layout.abuse_models)


def build(layout: Layout, strict: bool = True) -> list[Component]:
    """A component per workload of the layout's stack. `strict` (up): a disagreement between the
    render and the code raises, naming workload and field. Otherwise (status, down, logs) the
    unchecked processes are listed, so a broken render never keeps a stack from stopping."""
    try:
        procs = transforms.processes(layout, layout.stack, check=strict)
    except (transforms.Disagreement, rendered.RenderError):
        if strict:
            raise
        return []
    return [Workload(layout, p) for p in procs]


__all__ = ["STORES", "STORES_BY_FIELD", "Workload", "build", "workloads"]
