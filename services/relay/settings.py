"""The outbox relay's settings: the shared LIKES_* settings plus its own LIKES_RELAY_* knobs."""

from __future__ import annotations

import socket
import uuid

from pydantic import Field

from services.contracts.settings import Settings


class RelaySettings(Settings):
    # between passes that find rows; an idle pass waits convergence.RELAY_IDLE_INTERVAL_S
    relay_interval_s: float = Field(default=0.5, gt=0)
    # a row Kafka keeps refusing goes to likes.dead-letter after this many failed publishes,
    # at once when Kafka refuses it for what it is (too large, invalid), else once it has been
    # failing this long: a broker outage shorter than that dead-letters nothing
    relay_dead_letter_attempts: int = Field(default=5, ge=1)
    relay_dead_letter_after_s: float = Field(default=1800.0, gt=0)
    # this replica's name in the shard leases; empty: <hostname>-<random> (a restarted pod is a
    # new member: its old leases lapse on their own)
    relay_replica_id: str = ""

    def new_replica_id(self) -> str:
        return self.relay_replica_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
