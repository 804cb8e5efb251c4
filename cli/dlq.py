"""`likes dlq inspect|replay|report`: the dead-letter topic, for on-call.

- `inspect` lists dead letters (newest last) with their id (`partition:offset` on the dead-letter
  topic), the original event id, where they came from, which workload and consumer group gave up
  on them and why, and whether they can be read now.
- `replay ID...` publishes the selected events back to their source topic and partition, aimed at
  the consumer group that failed them (services/contracts/dlq.py: every other group skips a
  replay). `--set FIELD=VALUE` fixes the event first; it is then written with the schema the
  registry holds for this code. Refused, each with its reason: an event that still cannot be read
  or is still refused by the aggregator's checks; a reference whose message has left its source;
  an event older than the aggregator's dedup horizon (a copy of it may have been counted: only
  the horizon guarantees a replay counts once), unless `--reconcile`, which runs the reconciler
  (`likes recount`) on the replayed posts once the aggregator has read them.
- `report` is the seed's daily report: how many, from where, why, how many are readable now,
  against the DeadLetterDailyGrowth alert's limit.

Every replay confirms unless --yes and leaves an audit record (`likes audit`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli import alerts, audit, stack_settings, topic_read
from services.contracts import dlq, events, kafka

app = typer.Typer(
    help="Dead letters: inspect them, replay them to the group that failed them, the daily report.",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 2
FIXED_FIELDS = ("event_id", "intent_uuid")  # who the event is: a replay never changes them
JsonOpt = typer.Option(False, "--json", help="machine-readable output")
SinceOpt = typer.Option("1d", "--since", help="how far back (30m, 6h, 7d; the topic keeps 30d)")


class DlqError(Exception):
    """Kafka, the registry or the settings failed us: nothing (more) was done."""


@dataclass
class Letter(topic_read.Record):
    """One dead letter as read from the topic."""

    h: dict[str, str] = field(default_factory=dict)
    event: events.LikeEvent | None = None  # decoded and checked now
    decoded: events.LikeEvent | None = None  # decoded, whether the checks passed or not
    unreadable: str | None = None  # why not

    @property
    def id(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def reference(self) -> bool:
        return self.h.get(dlq.REFERENCE) == "1"

    def to_json(self) -> dict[str, Any]:
        e = self.decoded
        return {
            "id": self.id,
            "dead_lettered_at_ms": self.timestamp_ms,
            "key": None if self.key is None else self.key.decode(errors="replace"),
            "event_id": self.h.get(dlq.EVENT_ID) or (e.event_id if e else None),
            "intent_uuid": self.h.get(dlq.INTENT_UUID) or (e.intent_uuid if e else None),
            "post_id": e.post_id if e else None,
            "source_topic": self.h.get(dlq.SOURCE_TOPIC),
            "source_partition": _int(self.h.get(dlq.SOURCE_PARTITION)),
            "source_offset": _int(self.h.get(dlq.SOURCE_OFFSET)),
            "consumer": self.h.get(dlq.CONSUMER),
            "group": self.h.get(dlq.GROUP),
            "error": self.h.get(dlq.ERROR),
            "attempts": _int(self.h.get(dlq.ATTEMPTS)),
            "reference": self.reference,
            "readable": self.event is not None,
            "unreadable": self.unreadable,
        }


def _int(v: str | None) -> int | None:
    try:
        return None if v is None else int(v)
    except ValueError:
        return None


# -- reading -------------------------------------------------------------------------------------
class Tools:
    """The clients one command needs, from the platform's settings."""

    def __init__(self) -> None:
        from services.aggregator.settings import AggregatorSettings
        from services.contracts import clients

        try:
            self.settings = stack_settings.platform_settings()
        except (ValueError, stack_settings.NoSettings) as e:
            raise DlqError(str(e)) from e
        self.kafka = clients.kafka_config(self.settings)
        self.registry = clients.schema_registry(self.settings)
        self.deserialize = clients.like_deserializer(self.registry)
        self.serialize = clients.like_serializer(self.registry)
        self.horizon_s = float(AggregatorSettings.model_fields["agg_dedup_horizon_s"].default)

    def consumer(self) -> Any:
        return topic_read.consumer(self.kafka, "dlq-cli")

    def read(self, since_s: float) -> list[Letter]:
        """Every dead letter newer than `since_s` seconds, up to the end the topic had when the
        read started."""
        try:
            records = topic_read.read_since(self.kafka, events.DEAD_LETTER, since_s, "dlq-cli")
        except topic_read.ReadError as e:
            raise DlqError(str(e)) from e
        out = []
        for r in records:
            h = dlq.header_map(r.headers)
            out.append(Letter(r.partition, r.offset, r.timestamp_ms, r.key, r.value, r.headers, h))
        out.sort(key=lambda lt: (lt.timestamp_ms, lt.partition, lt.offset))
        return out

    def source_message(self, letter: Letter) -> tuple[bytes | None, bytes | None] | None:
        """A reference's (key, value) at its source offset; None when it has left the topic."""
        from confluent_kafka import TopicPartition

        topic = letter.h.get(dlq.SOURCE_TOPIC)
        p, o = _int(letter.h.get(dlq.SOURCE_PARTITION)), _int(letter.h.get(dlq.SOURCE_OFFSET))
        if not topic or p is None or o is None:
            return None
        c = self.consumer()
        try:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if not low <= o < high:
                return None
            c.assign([TopicPartition(topic, p, o)])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and m.error() is None and m.offset() == o:
                    return m.key(), m.value()
            return None
        finally:
            c.close()

    def check(self, letter: Letter, fixes: dict[str, str] | None = None) -> None:
        """Decode the letter's event (its source message, for a reference), apply `fixes`, and
        run the aggregator's checks on it: sets `event`, or `unreadable` with the reason."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        from services.aggregator.core import validate

        value = letter.value
        if letter.reference:
            found = self.source_message(letter)
            if found is None:
                letter.unreadable = "a reference whose message has left its source topic"
                return
            letter.key, value = found
        if not value:
            letter.unreadable = "no value"
            return
        try:
            ctx = SerializationContext(letter.h.get(dlq.SOURCE_TOPIC, ""), MessageField.VALUE)
            event = self.deserialize(value, ctx)
            if event is None:
                raise ValueError("no event")
            letter.decoded = event
            if fixes:
                event = _fixed(event, fixes)
            validate(event)
        except Exception as e:
            letter.unreadable = f"{type(e).__name__}: {e}"[:300]
            return
        letter.event = event
        letter.value = value


def _fixed(event: events.LikeEvent, fixes: dict[str, str]) -> events.LikeEvent:
    kinds = {f.name: f.type for f in dataclasses.fields(events.LikeEvent)}
    changes: dict[str, Any] = {}
    for name, raw in fixes.items():
        if name not in kinds or name in FIXED_FIELDS:
            raise ValueError(f"--set {name}: not a field a replay may change")
        changes[name] = _typed(str(kinds[name]), raw)
    return dataclasses.replace(event, **changes)


def _typed(kind: str, raw: str) -> Any:
    """`raw` as the event field's type ("int", "float | None", ...): `--set account_created=null`
    clears an optional field."""
    if "None" in kind and raw.lower() in ("", "null", "none"):
        return None
    if "int" in kind:
        return int(raw)
    if "float" in kind:
        return float(raw)
    return raw


def _parse_fixes(values: list[str]) -> dict[str, str]:
    fixes = {}
    editable = [f.name for f in dataclasses.fields(events.LikeEvent)]
    for v in values:
        name, sep, raw = v.partition("=")
        if not sep or name not in editable or name in FIXED_FIELDS:
            allowed = ", ".join(n for n in editable if n not in FIXED_FIELDS)
            raise typer.BadParameter(f"{v!r}: expected FIELD=VALUE, FIELD one of {allowed}")
        fixes[name] = raw
    return fixes


def _tools() -> Tools:
    try:
        return Tools()
    except DlqError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e


def _read(tools: Tools, since: str) -> list[Letter]:
    try:
        return tools.read(alerts._parse_since(since))
    except DlqError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e


def _age(ms: int) -> str:
    s = max(0, time.time() - ms / 1000)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


# -- commands ------------------------------------------------------------------------------------
@app.command()
def inspect(
    since: str = SinceOpt,
    consumer: Annotated[str | None, typer.Option(help="only this workload's")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="the newest N")] = 50,
    as_json: bool = JsonOpt,
) -> None:
    """List dead letters: id, age, workload and group, original event id, post, error, and
    whether the event can be read now (decoded with the registry, passed by the aggregator's
    checks)."""
    tools = _tools()
    letters = [lt for lt in _read(tools, since) if consumer in (None, lt.h.get(dlq.CONSUMER))]
    letters = letters[-limit:]
    for lt in letters:
        tools.check(lt)
    if as_json:
        typer.echo(json.dumps([lt.to_json() for lt in letters]))
        return
    t = Table("id", "age", "consumer", "group", "event id", "post", "error", "readable now")
    for lt in letters:
        j = lt.to_json()
        t.add_row(lt.id, _age(lt.timestamp_ms), j["consumer"] or "-", j["group"] or "-",
                  j["event_id"] or "-", j["post_id"] or "-", (j["error"] or "-")[:60],
                  "yes" if lt.event else f"no: {lt.unreadable}"[:60])  # fmt: skip
    console.print(t)
    console.print(f"{len(letters)} dead letter(s) in the last {since}")


@dataclass
class Plan:
    letter: Letter
    refused: str | None = None


def _plan(tools: Tools, letter: Letter, fixes: dict[str, str], reconcile: bool) -> Plan:
    tools.check(letter, fixes)
    if letter.event is None:
        return Plan(letter, f"still cannot be read: {letter.unreadable}")
    topic = letter.h.get(dlq.SOURCE_TOPIC)
    if not topic:
        return Plan(letter, "no source topic in its headers")
    age_s = time.time() - letter.event.occurred_at / 1000
    if age_s > tools.horizon_s and not reconcile:
        return Plan(
            letter,
            f"{age_s:.0f} s old, past the aggregator's dedup horizon ({tools.horizon_s:.0f} s): "
            "a copy may already be counted; --reconcile replays it and runs the reconciler",
        )
    return Plan(letter)


def _publish(tools: Tools, plans: list[Plan], fixes: dict[str, str]) -> list[tuple[str, int, int]]:
    """Publish the plans' events; the (topic, partition, offset) each one landed at."""
    from confluent_kafka import Producer
    from confluent_kafka.serialization import MessageField, SerializationContext

    p = Producer({**tools.kafka, "enable.idempotence": True})
    failed: list[str] = []
    landed: list[tuple[str, int, int]] = []
    for plan in plans:
        lt, event = plan.letter, plan.letter.event
        assert event is not None
        topic = lt.h[dlq.SOURCE_TOPIC]
        value = lt.value
        if fixes:
            value = tools.serialize(event, SerializationContext(topic, MessageField.VALUE))
        headers = [(k, v) for k, v in lt.headers if not k.startswith(dlq.PREFIX)]
        headers.append((dlq.REPLAY_OF, lt.id.encode()))
        if lt.h.get(dlq.GROUP):  # a consumer's dead letter: back to that group only
            headers.append((dlq.REPLAY_GROUP, lt.h[dlq.GROUP].encode()))
        partition = _int(lt.h.get(dlq.SOURCE_PARTITION))
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}

        def done(e: Any, m: Any, lid: str = lt.id) -> None:
            if e is not None:
                failed.append(f"{lid}: {e}")
            else:
                landed.append((m.topic(), m.partition(), m.offset()))

        p.produce(topic, key=lt.key, value=value, headers=headers, on_delivery=done, **kwargs)
    left = p.flush(30)
    if left or failed:
        raise DlqError(f"Kafka did not take every replay ({left} unsent): {'; '.join(failed)}")
    return landed


@app.command()
def replay(
    ids: Annotated[
        list[str] | None,
        typer.Argument(help="dead letters: their id (partition:offset) or original event id"),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every dead letter within --since")] = False,
    since: str = SinceOpt,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="FIELD=VALUE: fix the event before it goes back"),
    ] = None,
    reconcile: Annotated[
        bool,
        typer.Option(help="replay events past the dedup horizon, then run the reconciler"),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    as_json: bool = JsonOpt,
) -> None:
    """Publish dead letters back to their source topic and partition, for the consumer group
    that failed them only. Exit 0: every selected one replayed; 1: some refused (the rest
    replayed); 2: nothing could be done (Kafka, the registry, a selection that matches none)."""
    fixes = _parse_fixes(set_ or [])
    if not ids and not all_:
        raise typer.BadParameter("name dead letters (ID or event id), or --all", param_hint="IDS")
    tools = _tools()
    letters = _read(tools, since)
    wanted = set(ids or [])
    chosen = [lt for lt in letters if all_ or lt.id in wanted or lt.h.get(dlq.EVENT_ID) in wanted]
    missing = wanted - {lt.id for lt in chosen} - {lt.h.get(dlq.EVENT_ID) for lt in chosen}
    if not chosen or missing:
        err.print(f"[red]no dead letter {', '.join(sorted(missing)) or 'matches'} "
                  f"within --since {since}[/red]")  # fmt: skip
        raise typer.Exit(EXIT_ERROR)
    plans = [_plan(tools, lt, fixes, reconcile) for lt in chosen]
    go = [p for p in plans if p.refused is None]
    refused = {p.letter.id: p.refused for p in plans if p.refused is not None}
    if not as_json:
        for lid, why in refused.items():
            console.print(f"[yellow]refused[/yellow] {lid}: {why}")
    replayed: list[dict[str, Any]] = []
    if go:
        targets = sorted({f"{p.letter.h[dlq.SOURCE_TOPIC]} for {_target(p.letter)}" for p in go})
        if not yes and not typer.confirm(f"replay {len(go)} event(s) to {', '.join(targets)}?"):
            raise typer.Abort()
        args = {"ids": [p.letter.id for p in go], "set": fixes, "reconcile": reconcile}
        try:
            landed = _publish(tools, go, fixes)
        except DlqError as e:
            audit.record("dlq replay", args, "failed", str(e))
            err.print(f"[red]{e}[/red]")
            raise typer.Exit(EXIT_ERROR) from e
        for p in go:
            ev = p.letter.event
            assert ev is not None
            replayed.append({"id": p.letter.id, "event_id": ev.event_id, "post_id": ev.post_id,
                             "topic": p.letter.h[dlq.SOURCE_TOPIC],
                             "group": p.letter.h.get(dlq.GROUP)})  # fmt: skip
        audit.record("dlq replay", args, "ok", {"replayed": replayed, "refused": refused})
    reconciled = None
    if reconcile and replayed:
        _wait_counted(tools, landed)
        reconciled = _reconcile(sorted({r["post_id"] for r in replayed}))
    result = {"replayed": replayed, "refused": refused, "reconciled": reconciled}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for r in replayed:
            console.print(f"replayed {r['id']} (event {r['event_id']}) to {r['topic']} "
                          f"for {r['group'] or 'every consumer'}")  # fmt: skip
        for post, verdict in (reconciled or {}).items():
            console.print(f"reconciler on {post}: {verdict}")
    raise typer.Exit(EXIT_REFUSED if refused else EXIT_OK)


def _wait_counted(tools: Tools, landed: list[tuple[str, int, int]], timeout_s: float = 60) -> None:
    """Wait until the aggregator's group has committed past every replayed message (it commits
    after the window that counted them is written), or `timeout_s`; the reconciler then reads
    what the replay did."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**tools.kafka, "group.id": kafka.AGGREGATOR_GROUP, "enable.auto.commit": False})
    try:
        want = {(t, p): o for t, p, o in landed}
        deadline = time.monotonic() + timeout_s
        while want and time.monotonic() < deadline:
            got = c.committed([TopicPartition(t, p) for t, p in want], timeout=10)
            for tp in got:
                if tp.offset > want.get((tp.topic, tp.partition), tp.offset):
                    want.pop((tp.topic, tp.partition))
            if want:
                time.sleep(0.5)
        if want:
            err.print(f"[yellow]the aggregator has not read every replay in {timeout_s:.0f} s; "
                      "the reconciler may see it in flight[/yellow]")  # fmt: skip
    finally:
        c.close()


def _target(letter: Letter) -> str:
    return letter.h.get(dlq.GROUP) or "every consumer"


def _reconcile(posts: list[str]) -> dict[str, str]:
    """The reconciler's verdict on each replayed post, once the aggregator has read past the
    replay (it waits for that itself)."""
    from cli import recount

    out = {}
    for post in posts:
        try:
            report = recount._run(post, None, False, True, 60.0, True)
            out[post] = report["posts"][0]["status"]
        except recount.CliError as e:
            out[post] = f"not checked: {e}"
    return out


@app.command()
def report(since: str = SinceOpt, as_json: bool = JsonOpt) -> None:
    """The daily dead-letter report: how many, by workload and by error, how many can be read
    now (replayable once their cause is fixed), the oldest and newest, and the growth against
    the DeadLetterDailyGrowth alert's limit."""
    from infra import alert_rules

    tools = _tools()
    letters = _read(tools, since)
    for lt in letters:
        tools.check(lt)
    since_s = alerts._parse_since(since)
    per_day = len(letters) * 86400 / since_s if since_s else 0.0
    by_consumer = Counter(lt.h.get(dlq.CONSUMER, "?") for lt in letters)
    by_error = Counter(_kind(lt.h.get(dlq.ERROR, "")) for lt in letters)
    out: dict[str, Any] = {
        "since": since,
        "total": len(letters),
        "per_day": round(per_day, 1),
        "daily_limit": alert_rules.DEAD_LETTER_DAILY_LIMIT,
        "by_consumer": dict(by_consumer),
        "by_error": dict(by_error.most_common(10)),
        "readable_now": sum(lt.event is not None for lt in letters),
        "top_posts": dict(Counter(lt.event.post_id for lt in letters if lt.event).most_common(5)),
        "oldest_ms": letters[0].timestamp_ms if letters else None,
        "newest_ms": letters[-1].timestamp_ms if letters else None,
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    over = per_day > alert_rules.DEAD_LETTER_DAILY_LIMIT
    limit = f"{alert_rules.DEAD_LETTER_DAILY_LIMIT}/day" + (": [red]over[/red]" if over else "")
    console.print(f"[bold]{len(letters)}[/bold] dead letters in the last {since} "
                  f"({per_day:.0f}/day; the alert's limit is {limit})")  # fmt: skip
    t = Table("by workload", "count")
    for k, v in out["by_consumer"].items():
        t.add_row(k, str(v))
    console.print(t)
    t = Table("by error", "count")
    for k, v in out["by_error"].items():
        t.add_row(k, str(v))
    console.print(t)
    oldest = f"; oldest {_age(letters[0].timestamp_ms)} ago" if letters else ""
    console.print(f"readable now: {out['readable_now']} of {len(letters)}{oldest}")


def _kind(error: str) -> str:
    """An error's class for grouping: its text up to the first detail."""
    head = error.split(":", 1)[0].strip()
    return head[:60] or "(none)"
