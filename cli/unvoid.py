"""`likes abuse unvoid --model-version V [--since T]`: take back every void a bad model made.

The seed's "false-positive cascade (bad model deploy): manual rollback + cleanup via re-publish
of likes.unvoided". The voids are read back from `likes.voided` (the log is their record: each
names the like it voided and the model version, services/abuse/voids.py), and each is undone by
an unvoid conditional on that very void. So counts return exactly to what they were: an edge the
user unliked or liked again meanwhile is left alone (neither counted the void twice), and a second
run changes nothing (every edge it finds is no longer void).

Roll the model back first (the scorer would void the same likes again on a replay).
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli import alerts, audit, stack_settings, topic_read
from services.contracts import events

console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_ERROR = 0, 2
# unvoids in flight: each is a conditional write (a Paxos round) and an awaited publish, ~0.27 s
# one after another here (420 voids took 115 s in the abuse-bad-model-deploy game day). Each is
# conditional on its own void, so their order does not matter.
UNVOID_CONCURRENCY = 16


def _voids_of(records: list[topic_read.Record], model: str, deserialize: Any) -> list[Any]:
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(events.VOIDED, MessageField.VALUE)
    found: dict[str, events.LikeEvent] = {}  # by void intent: a republished void is one void
    for r in records:
        try:
            e = deserialize(r.value, ctx)
        except Exception:
            continue  # not an event we can read: it voided nothing we could take back
        if isinstance(e, events.LikeEvent) and e.action == "void" and e.model_version == model:
            found.setdefault(e.intent_uuid, e)
    return list(found.values())


def unvoid(
    model_version: Annotated[
        str, typer.Option("--model-version", help="the model version whose voids to take back")
    ],
    since: Annotated[
        str,
        typer.Option("--since", help="how far back (30m, 6h, 7d; the event topics keep 7 days)"),
    ] = "7d",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be undone")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Publish likes.unvoided for every void MODEL_VERSION made since T; counts return exactly."""
    from services.abuse.voids import Voider
    from services.contracts import clients
    from services.write.core import Publisher, Unavailable

    since_s = alerts._parse_since(since)
    try:
        settings = stack_settings.platform_settings()
    except (ValueError, stack_settings.NoSettings) as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e
    registry = clients.schema_registry(settings)
    kafka = clients.kafka_config(settings)
    try:
        records = topic_read.read_since(kafka, events.VOIDED, since_s, "abuse-unvoid")
    except topic_read.ReadError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e
    found = _voids_of(records, model_version, clients.like_deserializer(registry))
    posts = {v.post_id for v in found}
    summary = {"model_version": model_version, "since": since, "voids": len(found),
               "posts": len(posts)}  # fmt: skip
    if not found or dry_run:
        _report({**summary, "dry_run": dry_run, "results": {}}, json_out)
        return
    if not yes and not typer.confirm(
        f"Unvoid {len(found)} like(s) on {len(posts)} post(s) voided by model {model_version}?"
    ):
        raise typer.Abort()

    cluster, session = clients.cassandra(settings)
    publisher = Publisher(clients.producer(settings))
    tally: Counter[str] = Counter()
    failed: dict[str, str] = {}
    try:
        voider = Voider(
            session=session, publisher=publisher, region=settings.region,
            serialize=clients.like_serializer(registry),
        )  # fmt: skip
        with (
            Progress(console=err, transient=True, disable=json_out) as progress,
            ThreadPoolExecutor(UNVOID_CONCURRENCY) as pool,
        ):
            task = progress.add_task("unvoiding", total=len(found))
            running = {pool.submit(voider.unvoid, v): v for v in found}
            for done in as_completed(running):
                v = running[done]
                try:
                    tally[done.result().reason] += 1
                except Unavailable as e:  # a store is down: the rest may still go; say which
                    tally["failed"] += 1
                    failed[v.intent_uuid] = str(e)
                progress.advance(task)
    finally:
        publisher.close()
        cluster.shutdown()
    result = {**summary, "dry_run": False, "results": dict(tally), "failed": failed}
    audit.record("abuse unvoid", {"model_version": model_version, "since": since},
                 "failed" if failed else "ok", dict(tally))  # fmt: skip
    _report(result, json_out)
    if failed:
        raise typer.Exit(EXIT_ERROR)


def _report(result: dict[str, Any], json_out: bool) -> None:
    if json_out:
        print(json.dumps(result))
        return
    console.print(
        f"model {result['model_version']}: {result['voids']} void(s) on {result['posts']} "
        f"post(s) since {result['since']}" + (" (dry run)" if result["dry_run"] else "")
    )
    if result["results"]:
        t = Table("result", "voids", title="what each unvoid found")
        meaning = {
            "unvoided": "taken back: counted again",
            "not-void": "already not void (unvoided before, or liked again)",
            "not-liked": "the user unliked it meanwhile: stays out of the count",
            "superseded": "another void holds the edge now",
            "failed": "a store was down: run again",
        }
        for reason, n in sorted(result["results"].items()):
            t.add_row(f"{reason}: {meaning.get(reason, '')}", str(n))
        console.print(t)
