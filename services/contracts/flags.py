"""Kill switches: on-call's levers in etcd, `/likes/flags/kill/<name>`, set with `likes flags`.

What each switch does, in each workload (`EFFECTS` below is the same table, for `likes flags`
and the runbooks; a workload not named for a switch does nothing different):

- `writes-readonly`. write: every like and unlike answers 503 `writes_readonly` with
  Retry-After; reads are untouched, and what is already accepted (outbox rows, Kafka) keeps
  flowing to the counts.
- `panic`, the seed's lever for a bad config push: the data plane stops relying on the runtime
  control state and the control plane stops changing it. read: heat hints ignored (every post
  gets the cold edge TTL) and no hot-pool reads; write: split flags ignored (every event on
  shard 0: the aggregator sums every shard, so no count changes); hot-key sampler: as
  sampler-off; hot-key operator: as hotkeys-freeze. Writes stay on: the relay and the aggregator
  carry on.
- `schema-cache-flush`, each time it is set on: the aggregator drops its writer schemas and the
  write service its serializer's schema id; both fetch them again from the registry (the seed's
  fix for a poisoned schema cache). Setting it off does nothing.
- `sampler-off`. hot-key sampler: withdraws the hot-key flags and heat hints it published, at
  its next turn, and publishes none (it keeps sampling).
- `hotkeys-freeze`. hot-key operator: no promotion, demotion, split or unsplit; the current hot
  set is kept, its pool copies fresh.

A switch holds while etcd is unreachable: every workload keeps the last value it read for as long
as the outage lasts (unlike the hot-key state, whose last good copy expires after 5 minutes). A
workload that starts while etcd is down knows no switch and runs as if none were on. Each
workload exports what it sees as `likes_kill_switch{switch}` (1 on, 0 off).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from services.contracts import etcd, hotkeys, keys

PREFIX = keys.FLAGS_PREFIX + "kill/"
POLL_S = 1.0  # how soon a workload sees a switch change ("within seconds")
RETRY_AFTER_S = 30  # the Retry-After of a write refused by writes-readonly


class Switch(StrEnum):
    PANIC = "panic"
    WRITES_READONLY = "writes-readonly"
    SCHEMA_CACHE_FLUSH = "schema-cache-flush"
    SAMPLER_OFF = "sampler-off"
    HOTKEYS_FREEZE = "hotkeys-freeze"


EFFECTS: dict[Switch, str] = {
    Switch.WRITES_READONLY: "write: likes and unlikes answer 503 writes_readonly with "
    f"Retry-After {RETRY_AFTER_S}; reads untouched; accepted likes keep flowing",
    Switch.PANIC: "read: heat hints and hot pools ignored; write: split flags ignored; "
    "sampler: as sampler-off; operator: frozen; writes stay on",
    Switch.SCHEMA_CACHE_FLUSH: "each set on: the aggregator and the write service drop their "
    "cached schemas and fetch them again",
    Switch.SAMPLER_OFF: "sampler: withdraws its hot-key flags and heat hints and publishes none",
    Switch.HOTKEYS_FREEZE: "operator: no promotion, demotion, split or unsplit",
}
# the switches a workload honors (what `panic` implies is in `Switches.engaged`)
HONORED_BY: dict[str, tuple[Switch, ...]] = {
    "write": (Switch.WRITES_READONLY, Switch.PANIC, Switch.SCHEMA_CACHE_FLUSH),
    "read": (Switch.PANIC,),
    "hotkey-sampler": (Switch.SAMPLER_OFF, Switch.PANIC),
    "hotkey-operator": (Switch.HOTKEYS_FREEZE, Switch.PANIC),
    "aggregator": (Switch.SCHEMA_CACHE_FLUSH,),
}
# `panic` engages these too
_PANIC_IMPLIES = frozenset({Switch.SAMPLER_OFF, Switch.HOTKEYS_FREEZE})


class UnknownSwitch(ValueError):
    pass


def parse(name: str) -> Switch:
    try:
        return Switch(name.strip().lower())
    except ValueError:
        known = ", ".join(s.value for s in Switch)
        raise UnknownSwitch(f"no kill switch {name!r} (known: {known})") from None


def key(switch: Switch) -> str:
    return PREFIX + switch.value


@dataclass(frozen=True)
class State:
    on: bool
    by: str = ""
    since_ms: int = 0
    reason: str = ""

    def encode(self) -> bytes:
        d = {"on": self.on, "by": self.by, "since": self.since_ms, "reason": self.reason}
        return json.dumps(d).encode()

    def to_json(self) -> dict[str, Any]:
        return {"on": self.on, "by": self.by, "since_ms": self.since_ms, "reason": self.reason}


def decode(raw: bytes | str) -> State | None:
    """None for garbage (ignored: a bad value must not flip a switch). A bare on/off, true/false
    or 1/0 is accepted (an `etcdctl put` in a hurry)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    bare = text.strip().lower()
    if bare in ("on", "true", "1"):
        return State(True, "etcdctl")
    if bare in ("off", "false", "0"):
        return State(False, "etcdctl")
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("on"), bool):
        return None
    try:
        since = int(d.get("since", 0) or 0)
    except (TypeError, ValueError):
        since = 0
    return State(d["on"], str(d.get("by", "")), since, str(d.get("reason", "")))


def _decode_known(name: str) -> bool:
    return name in Switch._value2member_map_


def engaged_by(states: Mapping[str, State]) -> frozenset[Switch]:
    """The switches in force given each switch's state: those set on, and what panic implies."""
    on = {s for s in Switch if (state := states.get(s.value)) is not None and state.on}
    if Switch.PANIC in on:
        on |= _PANIC_IMPLIES
    return frozenset(on)


class Switches(hotkeys.PrefixView[State]):
    """A workload's view of the switches: polled every POLL_S, and the last value read is kept
    for as long as etcd stays unreachable (grace: forever). `engaged(s)` never blocks.

    `on_change(switch, state)` callbacks run in the poll task after each poll that changed a
    switch's value (the schema-cache flush hooks here); `gauge(switch, value)` exports it."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        interval_s: float = POLL_S,
        credentials: etcd.Credentials | None = None,
        ca_file: str | None = None,
        gauge: Callable[[str, float], None] | None = None,
    ) -> None:
        super().__init__(
            host, port, PREFIX, decode, interval_s=interval_s, grace_s=math.inf,
            credentials=credentials, ca_file=ca_file,
        )  # fmt: skip
        self._seen: dict[str, State] = {}
        self._engaged: frozenset[Switch] = frozenset()  # recomputed by each poll: grace is forever
        self._callbacks: list[Callable[[Switch, State | None], None]] = []
        self._gauge = gauge

    def on_change(self, callback: Callable[[Switch, State | None], None]) -> None:
        self._callbacks.append(callback)

    def is_set(self, switch: Switch) -> bool:
        state = self.current().get(switch.value)
        return state is not None and state.on

    def engaged(self, switch: Switch) -> bool:
        """On by itself, or through `panic` (which engages sampler-off and hotkeys-freeze). A set
        lookup: the read path asks it per request."""
        return switch in self._engaged

    async def refresh(self) -> None:
        await super().refresh()
        self.apply(self.current())

    def apply(self, states: Mapping[str, State]) -> None:
        """Take `states` (one poll's) as the switches in force: run the callbacks of the
        switches whose value changed, and export each switch."""
        now = {k: v for k, v in states.items() if _decode_known(k)}
        before, self._seen = self._seen, now
        self._engaged = engaged_by(now)
        for name in sorted(set(now) | set(before)):
            if now.get(name) != before.get(name):
                for callback in self._callbacks:
                    callback(Switch(name), now.get(name))
        if self._gauge is not None:
            for s in Switch:
                self._gauge(s.value, 1.0 if s in self._engaged else 0.0)


def from_settings(settings: Any, gauge: Callable[[str, float], None] | None = None) -> Switches:
    return Switches(
        settings.etcd_host,
        settings.etcd_port,
        credentials=etcd.credentials(settings),
        ca_file=settings.tls_ca_file,
        gauge=gauge,
    )
