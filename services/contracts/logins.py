"""A login to one of our servers (etcd, Kafka, the schema registry): one shape for all of them, so
a password never shows in a repr or a log line."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str = field(repr=False)
