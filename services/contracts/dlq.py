"""The dead-letter topic's record: the headers every consumer that dead-letters writes (the
aggregator, services/aggregator/dlq.py; the outbox relay, services/relay/core.py) and `likes dlq`
reads, and the replay header that sends a replayed event to one consumer group only.

A dead letter keeps the message's key, value and original headers, plus:
- `dlq.source.topic`, `.partition`, `.offset`: where it was read (the relay's: the topic only,
  it was never published);
- `dlq.consumer`: the workload that gave up on it; `dlq.group`: its consumer group, when it has
  one (the replay target);
- `dlq.error`, `dlq.attempts`; `dlq.event_id`, `dlq.intent_uuid` when the event decoded;
- `dlq.reference` = "1": no value, the message is still at its source offset (or, for the relay,
  in its outbox row);
- the relay's own: `dlq.source` = "outbox", `dlq.outbox.user_id`, `.bucket`, `.shard`.

A replay (`likes dlq replay`) publishes the event to its source topic and partition with
`dlq.replay.group` naming the group that failed it: every other group's consumer skips it (it
counted, or mirrored, the original already), and `dlq.replay.of` naming the dead letter
(`partition:offset`). A relay dead letter was never published: its replay has no group, and
every consumer reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SOURCE = "dlq.source"
SOURCE_TOPIC = "dlq.source.topic"
SOURCE_PARTITION = "dlq.source.partition"
SOURCE_OFFSET = "dlq.source.offset"
CONSUMER = "dlq.consumer"
GROUP = "dlq.group"
ERROR = "dlq.error"
ATTEMPTS = "dlq.attempts"
EVENT_ID = "dlq.event_id"
INTENT_UUID = "dlq.intent_uuid"
REFERENCE = "dlq.reference"
OUTBOX_USER_ID = "dlq.outbox.user_id"
OUTBOX_BUCKET = "dlq.outbox.bucket"
OUTBOX_SHARD = "dlq.outbox.shard"
PREFIX = "dlq."  # a replay drops these (the event goes back as it was produced)

REPLAY_GROUP = "replay.group"  # not under PREFIX: a replay keeps it
REPLAY_OF = "replay.of"

ERROR_MAX = 1000  # characters of the error kept


def header_map(headers: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """{name: text} of a message's headers (the last value of a repeated name wins)."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        out[name] = "" if value is None else str(value)
    return out


Headers = Iterable[tuple[str, Any]] | Mapping[str, Any] | None


def replay_for_another_group(headers: Headers, group: str) -> bool:
    """True when the message is a replay aimed at a consumer group other than `group`."""
    if not headers:
        return False  # the common case: one check, no iteration
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    for name, value in pairs:
        if name == REPLAY_GROUP:
            target = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            return target != group
    return False
