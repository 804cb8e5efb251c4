"""`likes status [lag|cache|kafka|cassandra|etcd] [--json]`: the stores as on-call looks at them.

One screen per view, read from the stores themselves (not from Prometheus, which may be what is
broken): consumer lag per group and partition (as the consumer-lag exporter reads it), the
nodes of the Redis Clusters (count-cache, idem-store, feature-store), Kafka's partitions with
their leaders and in-sync replicas, Cassandra's nodes as the driver sees them, etcd's members.
Each view lists what it found wrong under `problems`; the command exits 1 when any did, 2 when
it could not run.
Connection settings: cli/stack_settings.py (the LIKES_* variables, or the local stack).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli import stack_settings
from services.contracts import settings as settings_mod

console = Console()
err = Console(stderr=True)

View = dict[str, Any]  # {"view", "problems": [str], "rows": [dict]}
TIMEOUT_S = 10.0


def _lag(s: settings_mod.Settings) -> View:
    from confluent_kafka.admin import AdminClient

    from services.consumer_lag.core import LagReader, consumer_factory
    from services.consumer_lag.settings import LagSettings, parse_group_topics
    from services.contracts import clients

    conf = clients.kafka_config(s)
    defaults = LagSettings.model_fields
    groups = [g for g in str(defaults["lag_groups"].default).split(",") if g]
    topics = [t for t in str(defaults["lag_topics"].default).split(",") if t]
    own = parse_group_topics(str(defaults["lag_group_topics"].default))
    reader = LagReader(
        AdminClient(conf), consumer_factory(conf), groups, topics, TIMEOUT_S, topics_of=own
    )
    try:
        read = reader.read()
    finally:
        reader.close()
    from infra.alert_rules import CONSUMER_LAG_THRESHOLD_S

    lags = sorted(read.lags, key=lambda x: (x.group, x.topic, x.partition))
    rows = [
        {"group": x.group, "topic": x.topic, "partition": x.partition,
         "seconds": round(x.seconds, 1), "messages": x.messages, "committed": x.committed,
         "end": x.end}
        for x in lags
    ]  # fmt: skip
    problems = [
        f"{x.group} is {x.seconds:.0f} s behind on {x.topic}[{x.partition}]"
        for x in lags
        if x.seconds > CONSUMER_LAG_THRESHOLD_S
    ]
    # a partition Kafka did not answer for: a row without figures, and a problem naming why (the
    # column is there only when some partition is unread)
    if read.unread:
        for row in rows:
            row["unread"] = None
    for u in sorted(read.unread, key=lambda x: (x.group, x.topic, x.partition)):
        rows.append({"group": u.group, "topic": u.topic, "partition": u.partition,
                     "seconds": None, "messages": None, "committed": None, "end": None,
                     "unread": u.reason})  # fmt: skip
        problems.append(f"{u.group}'s lag on {u.topic}[{u.partition}] is unknown: {u.reason}")
    return {"view": "lag", "problems": problems, "rows": rows}


def _redis_nodes(name: str, rc: Any) -> tuple[list[dict[str, Any]], list[str]]:
    rows, problems = [], []
    for node in sorted(rc.get_nodes(), key=lambda n: (n.host, n.port)):
        address = f"{node.host}:{node.port}"
        try:
            info = rc.execute_command("INFO", "replication", target_nodes=node)
            memory = rc.execute_command("INFO", "memory", target_nodes=node)
            cluster = rc.execute_command("CLUSTER INFO", target_nodes=node)
        except Exception as e:
            rows.append({"store": name, "node": address, "role": "?", "state": "unreachable"})
            problems.append(f"{name} {address}: unreachable ({type(e).__name__}: {e})")
            continue
        state = cluster.get("cluster_state", "?") if isinstance(cluster, dict) else "?"
        role = info.get("role", "?")
        row = {
            "store": name,
            "node": address,
            "role": role,
            "state": state,
            "replicas": info.get("connected_slaves", 0) if role == "master" else None,
            "used_memory": memory.get("used_memory_human"),
            "maxmemory": memory.get("maxmemory_human"),
        }
        rows.append(row)
        if state != "ok":
            problems.append(f"{name} {address}: cluster_state {state}")
        if role == "master" and not row["replicas"]:
            problems.append(f"{name} {address}: a primary without a replica")
    return rows, problems


def _clusters(s: settings_mod.Settings) -> dict[str, Callable[[], Any]]:
    """The Redis Clusters to look at: each one's client. The feature-store only the abuse
    scorer reaches, so its nodes come from the scorer's env (in a deployed shell: from
    LIKES_FEATURE_STORE_NODES, when set)."""
    from services.contracts import clients, workloads

    found: dict[str, Callable[[], Any]] = {
        "count-cache": lambda: clients.count_cache(s, timeout=TIMEOUT_S),
        "idem-store": lambda: clients.idem_store(s, timeout=TIMEOUT_S),
    }
    nodes = settings_mod.FeatureStoreSettings.env_name("feature_store_nodes")
    if not stack_settings.in_environment() or nodes in os.environ:
        fs = stack_settings.workload_settings(
            settings_mod.FeatureStoreSettings, workloads.ABUSE_SCORER
        )
        found["feature-store"] = lambda: clients.feature_store(fs, timeout=TIMEOUT_S)
    return found


def _cache(s: settings_mod.Settings) -> View:
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for name, make in _clusters(s).items():
        try:
            rc = make()
        except Exception as e:  # no node of the cluster answered
            problems.append(f"{name}: unreachable ({type(e).__name__}: {e})")
            continue
        try:
            r, p = _redis_nodes(name, rc)
        finally:
            rc.close()
        rows += r
        problems += p
    return {"view": "cache", "problems": problems, "rows": rows}


def _kafka(s: settings_mod.Settings) -> View:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from services.contracts import clients, events

    admin = AdminClient(clients.kafka_config(s))
    md = admin.list_topics(timeout=TIMEOUT_S)
    ours = [t for t in (*events.EVENT_TOPICS, events.DEAD_LETTER) if t in md.topics]
    min_isr: dict[str, int | None] = {t: None for t in ours}
    try:  # production's ACLs may not let the services' user describe configs
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in ours])
        for res, fut in described.items():
            entry = fut.result(TIMEOUT_S).get("min.insync.replicas")
            min_isr[res.name] = int(entry.value) if entry is not None else None
    except Exception:
        pass
    rows, problems = [], [f"topic {t} missing" for t in events.EVENT_TOPICS if t not in md.topics]
    for t in ours:
        for p in sorted(md.topics[t].partitions.values(), key=lambda p: p.id):
            row = {"topic": t, "partition": p.id, "leader": p.leader, "replicas": list(p.replicas),
                   "isr": list(p.isrs), "min_isr": min_isr[t]}  # fmt: skip
            rows.append(row)
            where = f"{t}[{p.id}]"
            if p.leader < 0:
                problems.append(f"{where}: no leader (offline)")
            elif (floor := min_isr[t]) is not None and len(p.isrs) < floor:
                problems.append(f"{where}: {len(p.isrs)} in sync, below min ISR {floor}: "
                                "writes with acks=all fail")  # fmt: skip
            elif len(p.isrs) < len(p.replicas):
                problems.append(f"{where}: under-replicated ({len(p.isrs)}/{len(p.replicas)})")
    brokers = sorted(md.brokers)
    return {"view": "kafka", "problems": problems, "rows": rows, "brokers": brokers}


def _cassandra(s: settings_mod.Settings) -> View:
    from services.contracts import clients

    cluster, session = clients.cassandra(s, request_timeout=TIMEOUT_S)
    try:
        hosts = sorted(cluster.metadata.all_hosts(), key=lambda h: str(h.endpoint))
        rows = [
            {"node": str(h.endpoint), "datacenter": h.datacenter, "rack": h.rack,
             "up": bool(h.is_up), "version": str(h.release_version or "")}
            for h in hosts
        ]  # fmt: skip
        versions = session.execute("SELECT schema_version FROM system.local").one()
    finally:
        cluster.shutdown()
    problems = [f"{r['node']} ({r['datacenter']}/{r['rack']}) is down" for r in rows if not r["up"]]
    schema = str(versions.schema_version) if versions is not None else None
    return {"view": "cassandra", "problems": problems, "rows": rows, "schema_version": schema}


def _etcd(s: settings_mod.Settings) -> View:
    from services.contracts import etcd

    async def read() -> View:
        client = etcd.from_settings(s, TIMEOUT_S)
        try:
            status = await client.status()
            members = [m async for m in client.members()]
        finally:
            await client.close()
        leader = status.leader.id if status.leader is not None else None
        rows = [
            {"member": m.name, "id": f"{m.id:x}", "leader": m.id == leader,
             "client_urls": list(m.client_urls)}
            for m in members
        ]  # fmt: skip
        problems = [] if leader is not None else ["no leader: etcd refuses writes"]
        return {"view": "etcd", "problems": problems, "rows": rows, "version": status.version,
                "db_size": status.db_size, "raft_index": status.raft_index}  # fmt: skip

    return asyncio.run(read())


VIEWS: dict[str, Callable[[settings_mod.Settings], View]] = {
    "lag": _lag,
    "cache": _cache,
    "kafka": _kafka,
    "cassandra": _cassandra,
    "etcd": _etcd,
}


def _print(v: View) -> None:
    rows = v["rows"]
    title = v["view"] + ("" if v["problems"] else "  [green]ok[/green]")
    if rows:
        table = Table(*rows[0].keys(), title=title, title_justify="left")
        for r in rows:
            table.add_row(*(json.dumps(x) if isinstance(x, list) else str(x) for x in r.values()))
        console.print(table)
    else:
        console.print(title)
    extra = {k: x for k, x in v.items() if k not in ("view", "problems", "rows")}
    if extra:
        console.print("  " + ", ".join(f"{k} {x}" for k, x in extra.items()))
    for p in v["problems"]:
        console.print(f"  [bold red]problem[/bold red] {p}")


def status(
    view: Annotated[
        str | None,
        typer.Argument(
            help=f"One of: {', '.join(VIEWS)} (default: all of them).", show_default=False
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list, one object per view.")
    ] = False,
) -> None:
    """The stores as on-call looks at them: consumer lag, the Redis clusters, Kafka's
    partitions, Cassandra's nodes, etcd's members; each view's `problems` say what is wrong.

    --json prints a list of objects with view, problems (strings) and rows (objects); a view
    that could not read its store has one problem saying so. Exits 1 when any view found a
    problem."""
    if view is not None and view not in VIEWS:
        err.print(f"[red]no view {view!r}[/red]: one of {', '.join(VIEWS)}")
        raise typer.Exit(2)
    try:
        s = stack_settings.platform_settings()
    except (ValueError, stack_settings.NoSettings) as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    out: list[View] = []
    for name in [view] if view else list(VIEWS):
        try:
            out.append(VIEWS[name](s))
        except Exception as e:  # the store did not answer: that is the reading
            out.append({"view": name, "problems": [f"unreachable: {type(e).__name__}: {e}"],
                        "rows": []})  # fmt: skip
    if as_json:
        print(json.dumps(out))
    else:
        for v in out:
            _print(v)
    if any(v["problems"] for v in out):
        raise typer.Exit(1)
