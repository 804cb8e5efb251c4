"""The abuse signals a like carries: where each comes from, how it is checked, and the fields of
the like event that hold it (issue 13: the scorer's features need them, and only the write path
sees them).

- the client's IP: `CF-Connecting-IP`, set by the CDN and passed on by the gateway; event field
  `client_ip`;
- a device fingerprint: `X-Device-Fingerprint`, set by our clients; `device`;
- the account's age: the token's `account_created` claim (a NumericDate), set by the identity
  provider (locally local/issuer.py); `account_created` (epoch ms).

The event fields are optional with a null default: a FORWARD-compatible evolution of the like
event (services/schema/registry_schemas.py registers it under FORWARD), so a consumer on the older
schema keeps reading new events, and old events read as "no signal". A missing signal is never a
refusal (old clients, a CDN bypassed in a test); a malformed one is (400, `invalid_signal`): it is
a client that lies about itself.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from services.contracts import routes

CLIENT_IP_HEADER = routes.CLIENT_IP_HEADER  # the gateway's per-IP rate limit keys on it too
DEVICE_HEADER = "X-Device-Fingerprint"
ACCOUNT_CREATED_CLAIM = "account_created"

DEVICE_PATTERN = r"^[A-Za-z0-9_.:+/=\-]{1,128}$"
_DEVICE = re.compile(DEVICE_PATTERN)


class InvalidSignal(ValueError):
    """A signal is present but malformed; `signal` names it."""

    def __init__(self, signal: str, message: str) -> None:
        super().__init__(message)
        self.signal = signal


@dataclass(frozen=True)
class Signals:
    client_ip: str | None = None
    device: str | None = None
    account_created_ms: int | None = None


NO_SIGNALS = Signals()


def parse(client_ip: str | None, device: str | None, account_created: object = None) -> Signals:
    """The signals of one request from its headers and token claim; InvalidSignal names the
    first malformed one."""
    ip = None
    if client_ip:
        try:
            ip = str(ipaddress.ip_address(client_ip.strip()))
        except ValueError as e:
            raise InvalidSignal(
                CLIENT_IP_HEADER, f"{CLIENT_IP_HEADER} is not an IP address: {client_ip[:64]!r}"
            ) from e
    if device and not _DEVICE.match(device):
        raise InvalidSignal(DEVICE_HEADER, f"{DEVICE_HEADER} must match {DEVICE_PATTERN}")
    created = None
    if account_created is not None:
        if isinstance(account_created, bool) or not isinstance(account_created, int | float):
            raise InvalidSignal(
                ACCOUNT_CREATED_CLAIM,
                f"the token's {ACCOUNT_CREATED_CLAIM} claim must be a NumericDate (seconds)",
            )
        created = int(account_created * 1000)
    return Signals(ip, device or None, created)
