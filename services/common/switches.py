"""A workload's kill switches (services/contracts/flags.py): the gauge that exports what it sees
(`likes_kill_switch{switch}`), and a poll thread for a workload without an event loop.

    kill = flags.from_settings(settings, gauge=switches.export)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from services.contracts import flags
from services.contracts import metrics as metric_names

log = logging.getLogger("switches")

KILL_SWITCH = Gauge(
    metric_names.KILL_SWITCH, "Kill switches as this process sees them (1 engaged)", ["switch"]
)
SCHEMA_CACHE_FLUSHES = Counter(
    metric_names.SCHEMA_CACHE_FLUSHES, "Schema caches dropped by the schema-cache-flush switch"
)
for _s in flags.Switch:  # every switch reads 0 until the first poll says otherwise
    KILL_SWITCH.labels(_s.value).set(0)


def export(switch: str, value: float) -> None:
    KILL_SWITCH.labels(switch).set(value)


def flush_on_set(flush: Callable[[], None]) -> Callable[[flags.Switch, flags.State | None], None]:
    """A `Switches.on_change` callback: `flush()` each time schema-cache-flush is set on."""

    def changed(switch: flags.Switch, state: flags.State | None) -> None:
        if switch is flags.Switch.SCHEMA_CACHE_FLUSH and state is not None and state.on:
            flush()
            SCHEMA_CACHE_FLUSHES.inc()
            log.info("kill switch schema-cache-flush: schema cache dropped")

    return changed


def in_thread(kill: flags.Switches) -> flags.Switches:
    """Polls `kill` on its own event loop in a daemon thread (the aggregator's consumer loop is a
    thread, not a coroutine); its callbacks run on that thread."""
    started = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        loop.run_until_complete(kill.start())
        started.set()
        loop.run_forever()

    threading.Thread(target=run, name="kill-switches", daemon=True).start()
    started.wait(5)
    return kill
