"""`likes recount POST | --sample N [--repair] [--yes] [--json]`: the count reconciler.

Connection settings: cli/stack_settings.py (the LIKES_* variables, or the local stack reached with
the env it gives its aggregator, so the correction cell carries the same region as the
aggregator's cells).
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli import audit, stack_settings
from services.contracts import events, keys, settings
from services.recount import core

console = Console()
err = Console(stderr=True)

EXIT_CLEAN, EXIT_DRIFT, EXIT_ERROR = 0, 1, 2


class CliError(Exception):
    """The recount could not run: bad input, no settings, a store it cannot reach."""


def _aggregator_defaults() -> tuple[str, int]:
    """The aggregator's consumer group and count-cache TTL (its settings' defaults; the program
    renders neither, so every deployed aggregator runs with them)."""
    from services.aggregator.settings import AggregatorSettings

    f = AggregatorSettings.model_fields
    return str(f["agg_group_id"].default), int(f["agg_cache_ttl_s"].default)


def _post_json(v: core.Verdict) -> dict[str, Any]:
    last, first = v.last, v.first
    d = last.drift()
    c = v.correction
    return {
        "post_id": v.post_id,
        "status": v.status,
        "reason": v.reason,
        "truth": last.truth.count,
        "counter_store": last.store_count,
        "count_cache": None if last.cache is None else last.cache.count,
        "drift": {
            "counter_store": d.counter_store,
            "count_cache": d.count_cache,
            "reactions": dict(d.reactions),
        },
        "first_reading": {
            "truth": first.truth.count,
            "counter_store": first.store_count,
            "count_cache": None if first.cache is None else first.cache.count,
        },
        "correction": None
        if c is None
        else {
            "region": c.cell.region,
            "delta": c.delta,
            "value": c.new.value,
            "gen": c.gen,
            "cache_written": v.cache_written,
        },
    }


def _report(verdicts: list[core.Verdict], settle: Any, source: str, repair: bool) -> dict[str, Any]:
    s = core.summarize(verdicts)
    return {
        "source": source,
        "repair": repair,
        "checked": s.checked,
        "drift": s.drift,
        "drift_ratio": round(s.drift_ratio, 6),
        "repaired": s.repaired,
        "transient": s.transient,
        "undecided": s.undecided,
        "missing": s.missing,
        "settle": None
        if settle is None
        else {
            "settled": settle.settled,
            "waited_s": round(settle.waited_s, 2),
            "detail": settle.detail,
        },
        "posts": [_post_json(v) for v in verdicts],
    }


_STYLE = {"ok": "green", "transient": "green", "repaired": "cyan", "drift": "red"}  # else yellow


def _print(report: dict[str, Any]) -> None:
    t = Table(title=f"recount ({report['source']})")
    t.add_column("post", no_wrap=True)
    for col in ("truth", "counter-store", "count-cache", "status"):
        t.add_column(col, justify="right" if col != "status" else "left")
    notes = []
    for p in report["posts"]:
        cached = "-" if p["count_cache"] is None else str(p["count_cache"])
        status = p["status"]
        if p["correction"]:
            status += f" {p['correction']['delta']:+d}"
            notes.append(f"{p['post_id']}: correction in {p['correction']['region']}")
        if p["status"] != "ok":
            notes.append(f"{p['post_id']}: {p['reason']}")
        style = _STYLE.get(p["status"], "yellow")
        t.add_row(p["post_id"], str(p["truth"]), str(p["counter_store"]), cached,
                  f"[{style}]{status}[/]")  # fmt: skip
    console.print(t)
    for n in notes:
        console.print(n, highlight=False)
    line = (
        f"{report['checked']} checked: {report['drift']} with persistent drift "
        f"(ratio {report['drift_ratio']:.3f}), {report['repaired']} repaired, "
        f"{report['transient']} in flight, {report['undecided']} undecided"
    )
    st = report["settle"]
    if st is not None:
        line += f"; waited {st['waited_s']:.1f}s for the consumers"
        if not st["settled"]:
            line += f" and gave up: {st['detail']}"
    console.print(line)
    if report["drift"] > report["repaired"] and not report["repair"]:
        console.print("rerun with --repair to write corrections")


def _fail(message: str, json_out: bool) -> typer.Exit:
    if json_out:
        print(json.dumps({"error": message}))
    err.print(f"[red]error:[/] {message}")
    return typer.Exit(EXIT_ERROR)


def recount(
    post_id: Annotated[
        str | None,
        typer.Argument(help="The post to recount (or use --sample).", show_default=False),
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option(
            "--sample",
            min=1,
            max=1000,
            help="Recount the N posts with the latest events on likes.committed (read from the "
            "tail of its partitions).",
        ),
    ] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="Write a correction for drift that persisted.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Repair without asking.")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds to wait for the outbox and the aggregator to pass the first "
            "reading; posts still in flight then are left alone."
        ),
    ] = 60.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Recompute posts' counts from the edge-store (the by-post index) and compare them with the
    counter-store cells and the count-cache aggregate (invariant 6).

    Drift seen in a first reading is judged again once the outbox and the aggregator group have
    passed that reading; only drift present, unchanged, in both readings of an unchanged post is
    persistent. --repair writes it into the post's correction cell (<region>@recount) with a
    generation bump, and rewrites the count-cache aggregate.

    Exit status: 0 nothing left to look at (no drift, drift that was in flight, or repaired);
    1 drift not repaired, or posts left undecided (changing, unsettled, conflict); 2 the recount
    could not run (bad post id, unknown post, a store or Kafka unreachable).

    --json keys: source, repair, checked, drift (posts with persistent drift), drift_ratio
    (drift / posts decided), repaired, transient, undecided, missing, settle {settled, waited_s,
    detail} or null, posts [{post_id, status (ok|transient|drift|repaired|changing|unsettled|
    conflict|missing), reason, truth, counter_store, count_cache, drift {counter_store,
    count_cache, reactions}, first_reading {truth, counter_store, count_cache}, correction
    {region, delta, value, gen, cache_written} or null}]; on error only {error}.
    """
    try:
        report = _run(post_id, sample, repair, yes, timeout, json_out)
    except CliError as e:
        raise _fail(str(e), json_out) from None
    if json_out:
        print(json.dumps(report))
    else:
        _print(report)
    clean = all(p["status"] in core.GOOD for p in report["posts"])
    raise typer.Exit(EXIT_CLEAN if clean else EXIT_DRIFT)


def _run(
    post_id: str | None, sample: int | None, repair: bool, yes: bool, timeout: float,
    json_out: bool,
) -> dict[str, Any]:  # fmt: skip
    from redis.exceptions import RedisClusterException, RedisError

    from services.aggregator.store import CounterStore, StoreError
    from services.contracts import clients
    from services.recount import probes, reconcile

    if (post_id is None) == (sample is None):
        raise CliError("give one POST, or --sample N")
    if post_id is not None and not re.fullmatch(keys.POST_ID_PATTERN, post_id):
        raise CliError(f"{post_id!r} is not a post id (expected {keys.POST_ID_PATTERN})")
    try:
        s = stack_settings.platform_settings()
    except (ValueError, stack_settings.NoSettings) as e:  # a bad or unknown LIKES_* variable
        raise CliError(str(e)) from e
    if s.env != "local" and "region" not in s.model_fields_set:
        # the correction cell is named after the region: never let it default
        raise CliError(f"env={s.env}: set {settings.Settings.env_name('region')}")
    group, ttl_s = _aggregator_defaults()
    cassandra_errors: tuple[type[Exception], ...] = (StoreError, *clients.CASSANDRA_ERRORS)
    cassandra_at = f"{s.cassandra_hosts}:{s.cassandra_port}"
    with ExitStack() as stack:
        try:
            cluster, session = clients.cassandra(s, request_timeout=10.0)
        except Exception as e:  # NoHostAvailable, OperationTimedOut, ...
            raise CliError(f"edge-store/counter-store (Cassandra) {cassandra_at}: {e}") from e
        stack.callback(cluster.shutdown)
        try:
            rc = clients.count_cache(s, timeout=2.0)
        except (RedisError, RedisClusterException) as e:
            raise CliError(f"count-cache {s.count_cache_nodes}: {e}") from e
        stack.callback(rc.close)
        consumers = probes.Consumers(clients.kafka_config(s), group, events.EVENT_TOPICS)
        store = CounterStore(session)
        rec = reconcile.Reconciler(
            probes.Readings(session, rc), probes.Outbox(session), consumers, store, rc,
            region=s.region, cache_ttl_s=ttl_s,
        )  # fmt: skip
        try:
            if post_id is not None:
                posts, source = [post_id], "argument"
            else:
                posts = probes.recent_posts(clients.kafka_config(s), events.COMMITTED, sample or 0)
                source = f"the {len(posts)} posts with the latest events on {events.COMMITTED}"
            first, at = rec.first_reading(posts)
            if post_id is not None and first[post_id].missing:
                raise CliError(
                    f"no post {post_id!r}: no edge, counter cell or cached count names it"
                )
            verdicts, settle = rec.check(first, at, timeout)
            todo = [v for v in verdicts if v.status == "drift"]
            if repair and todo and (yes or _confirm(todo)):
                args = {"posts": [v.post_id for v in todo]}
                try:
                    verdicts = rec.repair(verdicts)
                except Exception as e:
                    audit.record("recount --repair", args, "failed", f"{type(e).__name__}: {e}")
                    raise
                done = {v.post_id: v.status for v in verdicts if v.post_id in args["posts"]}
                audit.record("recount --repair", args, "ok", done)
        except probes.ProbeError as e:
            raise CliError(str(e)) from e
        except cassandra_errors as e:
            raise CliError(f"edge-store/counter-store (Cassandra) {cassandra_at}: {e}") from e
        except (RedisError, RedisClusterException) as e:
            raise CliError(f"count-cache {s.count_cache_nodes}: {e}") from e
    return _report(verdicts, settle, source, repair)


def _confirm(todo: list[core.Verdict]) -> bool:
    names = ", ".join(v.post_id for v in todo[:10]) + (" ..." if len(todo) > 10 else "")
    try:
        return typer.confirm(f"write corrections for {len(todo)} post(s): {names}?", err=True)
    except typer.Abort:  # no terminal to answer on
        return False
