"""The local identity provider (local/issuer.py): the JWKS the gateway and the services verify
tokens against, at the address the stack's identity-provider URL maps to."""

from __future__ import annotations

import os
import sys

from local import issuer
from local.components.base import Component, Server, http_probe
from local.layout import HOST, REPO_ROOT

NAME = "identity-provider"


class IdentityProvider(Component):
    name = NAME

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.issuer}"

    @property
    def jwks_url(self) -> str:
        """What the stack's JWKS URI becomes locally (gateway and services alike)."""
        return self.url + issuer.JWKS_PATH

    def prepare(self) -> None:
        issuer.load_key(self.layout.home)  # created here, not racing the first `local token`

    def servers(self) -> list[Server]:
        # this checkout's code, whatever the virtualenv was installed from
        pythonpath = os.pathsep.join(x for x in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if x)
        argv = [sys.executable, "-m", "local.issuer", "--home", str(self.layout.home),
                "--host", HOST, "--port", str(self.layout.ports.issuer)]  # fmt: skip
        return [
            Server(
                name=NAME,
                argv=argv,
                address=self.url,
                probe=lambda: http_probe(self.jwks_url),
                env={"PYTHONPATH": pythonpath},
                start_timeout=30,
                stop_timeout=5,
            )
        ]
